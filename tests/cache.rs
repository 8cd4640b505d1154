//! End-to-end: the HTTP cache of the real `switchyard server`, driven with curl through the proxy
//! against a test origin written here (it counts every request it answers, and can pace its
//! bodies so fills overlap) and nginx. Bodies are compared byte for byte with the origin's.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

/// One resource of the test origin.
#[derive(Clone)]
struct Resource {
    body: Arc<Vec<u8>>,
    headers: Vec<(String, String)>,
    /// Sleep between 64 KiB pieces of the body (paces a fill so requests overlap it).
    pace: Option<Duration>,
}

fn resource(body: Vec<u8>) -> Resource {
    Resource {
        body: Arc::new(body),
        headers: vec![
            ("Content-Type".into(), "application/octet-stream".into()),
            ("ETag".into(), "\"v1\"".into()),
        ],
        pace: None,
    }
}

/// A keep-alive HTTP/1.1 origin on loopback that counts requests per path.
struct Origin {
    port: u16,
    counts: Arc<Mutex<HashMap<String, u32>>>,
}

impl Origin {
    fn start(resources: Vec<(&str, Resource)>) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let port = listener.local_addr().expect("addr").port();
        let counts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let resources: Arc<HashMap<String, Resource>> = Arc::new(
            resources
                .into_iter()
                .map(|(p, r)| (p.to_owned(), r))
                .collect(),
        );
        let c = counts.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (c, r) = (c.clone(), resources.clone());
                std::thread::spawn(move || serve_origin(stream, &c, &r));
            }
        });
        Origin { port, counts }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn count(&self, path: &str) -> u32 {
        self.counts
            .lock()
            .expect("counts")
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

fn serve_origin(
    stream: TcpStream,
    counts: &Mutex<HashMap<String, u32>>,
    resources: &HashMap<String, Resource>,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        let key = path.split('?').next().unwrap_or_default().to_owned();
        *counts
            .lock()
            .expect("counts")
            .entry(key.clone())
            .or_default() += 1;
        let Some(res) = resources.get(&key) else {
            let _ = out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            continue;
        };
        let mut head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n", res.body.len());
        for (n, v) in &res.headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        if out.write_all(head.as_bytes()).is_err() {
            return;
        }
        if method == "HEAD" {
            continue;
        }
        for piece in res.body.chunks(64 * 1024) {
            if out.write_all(piece).is_err() {
                return;
            }
            if let Some(p) = res.pace {
                std::thread::sleep(p);
            }
        }
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

/// A response as curl saw it: status, headers (lowercase names, last value wins), body.
struct Fetched {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn fetch(server: &Server, url: &str, extra: &[&str]) -> Fetched {
    let dir = tempfile::tempdir().expect("tempdir");
    let head_path = dir.path().join("head");
    let body_path = dir.path().join("body");
    let proxy = format!("http://{}", server.http);
    let mut args = vec![
        "-sS",
        "--max-time",
        "60",
        "-x",
        &proxy,
        "-D",
        head_path.to_str().expect("path"),
        "-o",
        body_path.to_str().expect("path"),
    ];
    args.extend_from_slice(extra);
    args.push(url);
    let out = curl(&args);
    assert!(
        out.status.success(),
        "curl {url}: {}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    );
    parse_fetched(&head_path, &body_path)
}

fn parse_fetched(head_path: &Path, body_path: &Path) -> Fetched {
    let head = std::fs::read_to_string(head_path).expect("head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Fetched {
        status,
        headers,
        body: std::fs::read(body_path).unwrap_or_default(),
    }
}

/// Waits until the `tier` holds `entries` (a fill seals its entry just after the client's last
/// byte).
fn wait_stored(server: &Server, tier: &str, entries: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stats = server.api_get("/api/v1/cache/stats");
        if stats[tier]["entries"] == entries {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{tier} never held {entries}: {stats}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn x_cache(f: &Fetched) -> &str {
    f.headers.get("x-cache").map_or("", String::as_str)
}

fn cache_yaml(storage: &str) -> String {
    format!(
        "cache:\n  enabled: true\n  storage:\n{storage}\n  rules:\n    - name: everything\n      domains: [\"*\"]\n      ttl: 1h\n"
    )
}

fn memory_storage(max: &str, policy: &str) -> String {
    format!("    type: memory\n    memory: {{ max_size: {max}, max_entries: 1000, evict_policy: {policy} }}")
}

fn tiered_storage(dir: &Path, threshold: &str) -> String {
    format!(
        "    type: tiered\n    memory: {{ max_size: 64MiB }}\n    disk: {{ path: \"{}\", max_size: 1GiB, cleanup_interval: 1h }}\n    tiered: {{ memory_threshold: {threshold} }}",
        dir.display()
    )
}

fn disk_storage(dir: &Path) -> String {
    format!(
        "    type: disk\n    disk: {{ path: \"{}\", max_size: 1GiB, cleanup_interval: 1h }}",
        dir.display()
    )
}

#[test]
fn miss_then_hit_with_one_origin_request_and_api_views() {
    let Some(_) = require("curl") else { return };
    let small = pattern(10_000, 1);
    let origin = Origin::start(vec![("/small.bin", resource(small.clone()))]);
    let server = start_server(&cache_yaml(&memory_storage("16MiB", "lru")));
    let url = origin.url("/small.bin");

    let first = fetch(&server, &url, &[]);
    assert_eq!(first.status, 200);
    assert_eq!(x_cache(&first), "MISS");
    assert_eq!(first.body, small);
    let second = fetch(&server, &url, &[]);
    assert_eq!(x_cache(&second), "HIT");
    assert_eq!(second.body, small);
    assert_eq!(
        second.headers.get("etag").map(String::as_str),
        Some("\"v1\"")
    );
    assert_eq!(
        origin.count("/small.bin"),
        1,
        "the hit must not reach the origin"
    );

    // Conditional request on a hit → 304 without a body.
    let not_modified = fetch(&server, &url, &["-H", "If-None-Match: \"v1\""]);
    assert_eq!(not_modified.status, 304);
    assert!(not_modified.body.is_empty());

    let stats = server.api_get("/api/v1/cache/stats");
    assert_eq!(stats["enabled"], true);
    assert_eq!(stats["storage_type"], "memory");
    assert_eq!(stats["cache_hits"], 2);
    assert_eq!(stats["cache_misses"], 1);
    assert_eq!(stats["total_requests"], 3);
    assert_eq!(stats["memory"]["entries"], 1);
    assert_eq!(stats["memory"]["size_bytes"], 10_000);

    let list = server.api_get("/api/v1/cache/entries?domain=127.0.0.1");
    assert_eq!(list["total"], 1);
    assert_eq!(list["limit"], 100);
    let entry = &list["entries"][0];
    assert_eq!(entry["url"], url);
    assert_eq!(entry["size"], 10_000);
    assert_eq!(entry["content_type"], "application/octet-stream");
    let key = entry["key"].as_str().expect("key").to_owned();
    let encoded: String = key
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let one = server.api_get(&format!("/api/v1/cache/entries/{encoded}"));
    assert_eq!(one["key"], key.as_str());
    assert_eq!(
        server.api_get("/api/v1/cache/entries?domain=example.com")["total"],
        0
    );
    assert_eq!(
        server.api_get("/api/v1/cache/entries?limit=5000")["limit"],
        1000
    );

    let (status, body) = api_call(
        &server,
        "DELETE",
        &format!("/api/v1/cache/entries/{encoded}"),
        None,
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["key"], key.as_str());
    let (status, _) = api_call(
        &server,
        "DELETE",
        &format!("/api/v1/cache/entries/{encoded}"),
        None,
        None,
    );
    assert_eq!(status, 404);
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "MISS");
    assert_eq!(origin.count("/small.bin"), 2);

    // Clearing needs confirm=true.
    let (status, body) = api_call(&server, "DELETE", "/api/v1/cache/entries", None, None);
    assert_eq!(status, 400, "{body}");
    let (status, body) = api_call(
        &server,
        "DELETE",
        "/api/v1/cache/entries?confirm=true",
        None,
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body["time"].is_string());
    assert_eq!(
        server.api_get("/api/v1/cache/stats")["memory"]["entries"],
        0
    );

    // By domain: counts what it removed.
    fetch(&server, &url, &[]);
    let (status, body) = api_call(
        &server,
        "DELETE",
        "/api/v1/cache/domain/127.0.0.1",
        None,
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deleted"], 1);
    assert_eq!(body["domain"], "127.0.0.1");

    // The spec's metrics, with their labels.
    let metrics_port = free_port();
    drop(server);
    let server = start_server(&format!(
        "{}metrics: {{ enabled: true, listen: \"127.0.0.1:{metrics_port}\" }}\n",
        cache_yaml(&memory_storage("16MiB", "lru"))
    ));
    fetch(&server, &url, &[]);
    fetch(&server, &url, &[]);
    wait_for_port(metrics_port);
    let out = curl(&["-sS", &format!("http://127.0.0.1:{metrics_port}/metrics")]);
    let text = String::from_utf8_lossy(&out.stdout);
    for series in [
        "proxy_cache_hits_total{domain=\"127.0.0.1\"} 1",
        "proxy_cache_misses_total{domain=\"127.0.0.1\",reason=\"not_cached\"} 1",
        "proxy_cache_bytes_served_total{source=\"cache\"} 10000",
        "proxy_cache_bytes_served_total{source=\"origin\"} 10000",
        "proxy_cache_storage_entries{tier=\"memory\"} 1",
        "proxy_cache_storage_size_bytes{tier=\"memory\"} 10000",
        "proxy_cache_operation_duration_seconds_count{operation=\"lookup\"}",
    ] {
        assert!(text.contains(series), "missing {series} in:\n{text}");
    }
}

#[test]
fn ranges_from_cache_match_the_origin_bytes() {
    let Some(_) = require("curl") else { return };
    let big = pattern(3_000_000, 7);
    let origin = Origin::start(vec![("/big.bin", resource(big.clone()))]);
    let disk = tempfile::tempdir().expect("tempdir");
    let server = start_server(&cache_yaml(&tiered_storage(disk.path(), "1MiB")));
    let url = origin.url("/big.bin");

    // A range on a miss: 206 for the client while the whole file is fetched and stored.
    let first = fetch(&server, &url, &["-H", "Range: bytes=1000-1999"]);
    assert_eq!(first.status, 206);
    assert_eq!(x_cache(&first), "MISS");
    assert_eq!(first.headers["content-range"], "bytes 1000-1999/3000000");
    assert_eq!(first.body, &big[1000..2000]);

    // Stored on disk (above the 1 MiB threshold), whole — once the fill has sealed it.
    wait_stored(&server, "disk", 1);
    let list = server.api_get("/api/v1/cache/entries");
    assert_eq!(list["entries"][0]["tier"], "disk");
    assert_eq!(list["entries"][0]["size"], 3_000_000);

    let full = fetch(&server, &url, &[]);
    assert_eq!(x_cache(&full), "HIT");
    assert_eq!(full.body, big);
    let tail = fetch(&server, &url, &["-H", "Range: bytes=-500"]);
    assert_eq!(tail.status, 206);
    assert_eq!(tail.body, &big[big.len() - 500..]);
    assert_eq!(
        tail.headers["content-range"],
        "bytes 2999500-2999999/3000000"
    );
    let open = fetch(&server, &url, &["-H", "Range: bytes=2999990-"]);
    assert_eq!(open.body, &big[2_999_990..]);

    // Multi-range: multipart/byteranges whose parts are the origin's bytes.
    let multi = fetch(&server, &url, &["-H", "Range: bytes=0-9,100-199,2999999-"]);
    assert_eq!(multi.status, 206);
    let ctype = &multi.headers["content-type"];
    let boundary = ctype
        .split("boundary=")
        .nth(1)
        .expect("boundary")
        .trim_matches('"')
        .to_owned();
    let parts = split_multipart(&multi.body, &boundary);
    let want: Vec<(&str, &[u8])> = vec![
        ("bytes 0-9/3000000", &big[0..10]),
        ("bytes 100-199/3000000", &big[100..200]),
        ("bytes 2999999-2999999/3000000", &big[2_999_999..]),
    ];
    assert_eq!(parts.len(), want.len(), "parts of {ctype}");
    for ((range, body), (want_range, want_body)) in parts.iter().zip(want) {
        assert_eq!(range, want_range);
        assert_eq!(body.as_slice(), want_body);
    }

    // Unsatisfiable → 416 with the length; malformed → the whole file.
    let bad = fetch(&server, &url, &["-H", "Range: bytes=5000000-"]);
    assert_eq!(bad.status, 416);
    assert_eq!(bad.headers["content-range"], "bytes */3000000");
    let malformed = fetch(&server, &url, &["-H", "Range: bytes=abc"]);
    assert_eq!(malformed.status, 200);
    assert_eq!(malformed.body.len(), big.len());
    let other_unit = fetch(&server, &url, &["-H", "Range: items=0-5"]);
    assert_eq!(other_unit.status, 200);
    // If-Range with another validator → the whole file.
    let stale = fetch(
        &server,
        &url,
        &["-H", "Range: bytes=0-9", "-H", "If-Range: \"v0\""],
    );
    assert_eq!(stale.status, 200);
    assert_eq!(stale.body, big);
    let fresh = fetch(
        &server,
        &url,
        &["-H", "Range: bytes=0-9", "-H", "If-Range: \"v1\""],
    );
    assert_eq!(fresh.status, 206);
    assert_eq!(origin.count("/big.bin"), 1);
}

/// Parts of a multipart/byteranges body: (Content-Range, bytes).
fn split_multipart(body: &[u8], boundary: &str) -> Vec<(String, Vec<u8>)> {
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = body;
    while let Some(at) = find(rest, delimiter.as_bytes()) {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let head_end = find(rest, b"\r\n\r\n").expect("part head");
        let head = String::from_utf8_lossy(&rest[..head_end]).into_owned();
        let range = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Range: "))
            .expect("Content-Range in part")
            .to_owned();
        let (_, span) = range.split_once(' ').expect("unit");
        let (first, last) = span
            .split('/')
            .next()
            .expect("span")
            .split_once('-')
            .expect("-");
        let len = last.parse::<usize>().expect("last") - first.parse::<usize>().expect("first") + 1;
        let data = &rest[head_end + 4..head_end + 4 + len];
        parts.push((range, data.to_vec()));
        rest = &rest[head_end + 4 + len..];
    }
    parts
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn parallel_misses_are_coalesced_into_one_origin_fetch() {
    let Some(_) = require("curl") else { return };
    let body = pattern(2_000_000, 3);
    let mut slow = resource(body.clone());
    // ~0.6 s for the whole body: the other clients arrive while the fill runs.
    slow.pace = Some(Duration::from_millis(20));
    let origin = Origin::start(vec![("/update.pkg", slow)]);
    let disk = tempfile::tempdir().expect("tempdir");
    let server = start_server(&cache_yaml(&tiered_storage(disk.path(), "256KiB")));
    let url = origin.url("/update.pkg");
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let proxy = format!("http://{}", server.http);
            let url = url.clone();
            std::thread::spawn(move || curl(&["-sS", "--max-time", "60", "-x", &proxy, &url]))
        })
        .collect();
    for c in clients {
        let out = c.join().expect("client");
        let logs = || server.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs()
        );
        assert!(out.stdout == body, "body differs; {}", logs());
    }
    assert_eq!(
        origin.count("/update.pkg"),
        1,
        "8 parallel clients, one origin fetch"
    );
    let stats = server.api_get("/api/v1/cache/stats");
    assert_eq!(stats["cache_hits"], 7);
    assert_eq!(stats["cache_misses"], 1);
}

#[test]
fn eviction_follows_the_configured_policy() {
    let Some(_) = require("curl") else { return };
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("/f{i}"), pattern(100_000, i)))
        .collect();
    let origin = Origin::start(
        files
            .iter()
            .map(|(p, b)| (p.as_str(), resource(b.clone())))
            .collect(),
    );
    let stored = |server: &Server| -> Vec<String> {
        let list = server.api_get("/api/v1/cache/entries");
        let mut paths: Vec<String> = list["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| {
                e["url"]
                    .as_str()
                    .unwrap_or_default()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        paths.sort();
        paths
    };
    // Room for three 100 kB bodies. Fill f0, f1, f2; use f0 twice more and f1 once; add f3.
    for (policy, evicted) in [("lru", "f2"), ("lfu", "f2"), ("fifo", "f0")] {
        let server = start_server(&cache_yaml(&memory_storage("300000", policy)));
        // Each fill is sealed before the next request, so the use order is exactly this one.
        for (i, f) in ["/f0", "/f1", "/f2"].iter().enumerate() {
            fetch(&server, &origin.url(f), &[]);
            wait_stored(&server, "memory", i as u64 + 1);
        }
        for f in ["/f0", "/f1", "/f0"] {
            fetch(&server, &origin.url(f), &[]);
        }
        // LRU order now f2 (oldest use), f1, f0; LFU counts f0:3, f1:2, f2:1; FIFO f0 first in.
        if policy == "lru" {
            fetch(&server, &origin.url("/f1"), &[]);
        }
        fetch(&server, &origin.url("/f3"), &[]);
        let deadline = Instant::now() + Duration::from_secs(15);
        while server.api_get("/api/v1/cache/stats")["evictions"] != 1 {
            assert!(Instant::now() < deadline, "{policy}: f3 never stored");
            std::thread::sleep(Duration::from_millis(20));
        }
        let left = stored(&server);
        assert_eq!(left.len(), 3, "{policy}: {left:?}");
        assert!(
            !left.contains(&evicted.to_owned()),
            "{policy} should evict {evicted}: {left:?}"
        );
        let stats = server.api_get("/api/v1/cache/stats");
        assert_eq!(stats["evictions"], 1, "{policy}");
    }
}

#[test]
fn entries_expire_after_their_ttl() {
    let Some(_) = require("curl") else { return };
    let origin = Origin::start(vec![("/short", resource(pattern(1000, 9)))]);
    let yaml = format!(
        "cache:\n  enabled: true\n  storage:\n{}\n  rules:\n    - {{ name: short, domains: [\"*\"], ttl: 1s }}\n",
        memory_storage("1MiB", "lru")
    );
    let server = start_server(&yaml);
    let url = origin.url("/short");
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "MISS");
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "HIT");
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "MISS");
    assert_eq!(origin.count("/short"), 2);
}

#[test]
fn cache_control_is_honoured_only_when_the_rule_asks() {
    let Some(_) = require("curl") else { return };
    let mut private = resource(pattern(5000, 2));
    private
        .headers
        .push(("Cache-Control".into(), "private, max-age=600".into()));
    let mut cookie = resource(pattern(5000, 4));
    cookie
        .headers
        .push(("Set-Cookie".into(), "session=abc".into()));
    let origin = Origin::start(vec![("/private", private), ("/cookie", cookie)]);
    let rule = |respect: bool| {
        format!(
            "cache:\n  enabled: true\n  storage:\n{}\n  rules:\n    - {{ name: r, domains: [\"*\"], respect_cache_control: {respect} }}\n",
            memory_storage("1MiB", "lru")
        )
    };
    let server = start_server(&rule(true));
    for path in ["/private", "/cookie"] {
        fetch(&server, &origin.url(path), &[]);
        let again = fetch(&server, &origin.url(path), &[]);
        assert_eq!(x_cache(&again), "MISS", "{path} must not be stored");
    }
    assert_eq!(origin.count("/private"), 2);
    drop(server);
    // lancache style: origin headers ignored, the rule decides.
    let server = start_server(&rule(false));
    fetch(&server, &origin.url("/private"), &[]);
    assert_eq!(
        x_cache(&fetch(&server, &origin.url("/private"), &[])),
        "HIT"
    );
    assert_eq!(origin.count("/private"), 3);
}

#[test]
fn disk_entries_survive_restart_and_a_killed_fill_leaves_nothing_servable() {
    let Some(_) = require("curl") else { return };
    let done = pattern(1_500_000, 5);
    let large = pattern(8_000_000, 6);
    let mut slow = resource(large.clone());
    slow.pace = Some(Duration::from_millis(25));
    let origin = Origin::start(vec![
        ("/done.bin", resource(done.clone())),
        ("/large.bin", slow),
    ]);
    let disk = tempfile::tempdir().expect("tempdir");
    let yaml = cache_yaml(&disk_storage(disk.path()));

    let server = start_server(&yaml);
    assert_eq!(fetch(&server, &origin.url("/done.bin"), &[]).body, done);
    // The entry is sealed (synced, renamed) just after the client has its last byte.
    wait_stored(&server, "disk", 1);
    // Start a slow fill, wait until the client has part of it (the leader writes each piece
    // to the client, then to the file), then kill -9 the server.
    let proxy = format!("http://{}", server.http);
    let url = origin.url("/large.bin");
    let partial = disk.path().with_extension("partial");
    let out = partial.clone();
    let client = std::thread::spawn(move || {
        curl(&[
            "-sS",
            "--max-time",
            "60",
            "-x",
            &proxy,
            "-o",
            out.to_str().expect("path"),
            &url,
        ])
    });
    let tmp = disk.path().join("tmp");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&partial).map_or(0, |m| m.len()) < 2_000_000 {
        assert!(Instant::now() < deadline, "fill never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_dir(&tmp).map(|d| d.count()).unwrap_or(0),
        1,
        "fill in tmp/"
    );
    drop(server); // SIGKILL
    let _ = client.join();
    let _ = std::fs::remove_file(&partial);

    let server = start_server(&yaml);
    let log = server.logs.lock().expect("logs").join("\n");
    assert!(log.contains("HTTP cache ready"), "{log}");
    let stats = server.api_get("/api/v1/cache/stats");
    assert_eq!(
        stats["disk"]["entries"], 1,
        "only the complete entry is indexed: {stats}"
    );
    assert_eq!(
        std::fs::read_dir(&tmp).map(|d| d.count()).unwrap_or(0),
        0,
        "tmp/ emptied"
    );
    let again = fetch(&server, &origin.url("/done.bin"), &[]);
    assert_eq!(x_cache(&again), "HIT");
    assert_eq!(again.body, done);
    // The interrupted file is fetched again, whole.
    let refetch = fetch(&server, &origin.url("/large.bin"), &[]);
    assert_eq!(x_cache(&refetch), "MISS");
    assert_eq!(refetch.body, large);
    assert_eq!(origin.count("/large.bin"), 2);
    assert_eq!(origin.count("/done.bin"), 1);
}

#[test]
fn unusable_cache_directory_still_proxies_and_counts_store_errors() {
    let Some(_) = require("curl") else { return };
    let body = pattern(200_000, 8);
    let origin = Origin::start(vec![("/x.bin", resource(body.clone()))]);
    let dir = tempfile::tempdir().expect("tempdir");
    let blocker = dir.path().join("not-a-directory");
    std::fs::write(&blocker, b"file").expect("file");
    let server = start_server(&cache_yaml(&disk_storage(&blocker.join("cache"))));
    for _ in 0..2 {
        let got = fetch(&server, &origin.url("/x.bin"), &[]);
        assert_eq!(got.status, 200);
        assert_eq!(got.body, body);
        assert_eq!(x_cache(&got), "MISS");
    }
    let stats = server.api_get("/api/v1/cache/stats");
    assert_eq!(stats["store_errors"], 2, "{stats}");
    let log = server.logs.lock().expect("logs").join("\n");
    assert!(log.contains("cannot store cache entry"), "{log}");
}

#[test]
fn rules_and_presets_through_the_api_reload_live() {
    let Some(_) = require("curl") else { return };
    let origin = Origin::start(vec![("/r.bin", resource(pattern(3000, 1)))]);
    let server = start_server(&format!(
        "cache:\n  enabled: true\n  storage:\n{}\n",
        memory_storage("1MiB", "lru")
    ));
    let url = origin.url("/r.bin");
    // No rule covers 127.0.0.1: not cached, not counted.
    fetch(&server, &url, &[]);
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "");
    assert_eq!(server.api_get("/api/v1/cache/stats")["total_requests"], 0);

    let presets = server.api_get("/api/v1/cache/presets");
    assert_eq!(presets["count"], 13);
    let first = presets["presets"][0]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let (status, body) = api_call(
        &server,
        "POST",
        &format!("/api/v1/cache/presets/{first}/enable"),
        None,
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["preset"], first.as_str());
    let rules = server.api_get("/api/v1/cache/rules");
    assert!(rules["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .any(|r| r["preset"] == first.as_str()));
    let (status, _) = api_call(
        &server,
        "POST",
        &format!("/api/v1/cache/presets/{first}"),
        Some("{\"enabled\": false}"),
        None,
    );
    assert_eq!(status, 200);
    let (status, _) = api_call(
        &server,
        "POST",
        "/api/v1/cache/presets/no-such/enable",
        None,
        None,
    );
    assert_eq!(status, 404);

    let (status, body) = api_call(
        &server,
        "POST",
        "/api/v1/cache/rules",
        Some(r#"{"name":"lan","domains":["127.0.0.1"],"enabled":true,"ttl":"168h","priority":5}"#),
        None,
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["rule"]["ttl"], "168h0m0s");
    let (status, _) = api_call(
        &server,
        "POST",
        "/api/v1/cache/rules",
        Some(r#"{"name":"lan","domains":["x.com"]}"#),
        None,
    );
    assert_eq!(status, 409);
    let (status, body) = api_call(
        &server,
        "POST",
        "/api/v1/cache/rules",
        Some(r#"{"name":"bad","domains":["a*b*c..com"]}"#),
        None,
    );
    assert_eq!(status, 400, "{body}");
    let (status, _) = api_call(
        &server,
        "POST",
        "/api/v1/cache/rules",
        Some(r#"{"name":"x","domains":["x.com"],"ttl":"soon"}"#),
        None,
    );
    assert_eq!(status, 400);

    // The new rule applies to the next request.
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "MISS");
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "HIT");

    let (status, body) = api_call(
        &server,
        "PUT",
        "/api/v1/cache/rules/lan",
        Some(r#"{"enabled":false}"#),
        None,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rule"]["enabled"], false);
    assert_eq!(
        x_cache(&fetch(&server, &url, &[])),
        "",
        "disabled rule: bypassed"
    );
    let (status, _) = api_call(&server, "DELETE", "/api/v1/cache/rules/lan", None, None);
    assert_eq!(status, 200);
    let (status, _) = api_call(&server, "DELETE", "/api/v1/cache/rules/lan", None, None);
    assert_eq!(status, 404);

    let meta = server.api_get("/api/v1/config/meta");
    let text = meta.to_string();
    assert!(text.contains("\"cache\""), "{text}");
}

#[test]
fn nginx_origin_bytes_match_through_the_cache() {
    let big = pattern(5_000_000, 11);
    let Some(nginx) = start_nginx(&[("game.pak", &big)]) else {
        return;
    };
    let disk = tempfile::tempdir().expect("tempdir");
    let server = start_server(&cache_yaml(&tiered_storage(disk.path(), "1MiB")));
    let url = nginx.url("/game.pak");
    let miss = fetch(&server, &url, &[]);
    assert_eq!(miss.body, big);
    let hit = fetch(&server, &url, &[]);
    assert_eq!(x_cache(&hit), "HIT");
    assert_eq!(hit.body, big);
    assert!(hit.headers.contains_key("last-modified"));
    let slice = fetch(&server, &url, &["-H", "Range: bytes=4000000-4000099"]);
    assert_eq!(slice.body, &big[4_000_000..4_000_100]);
    let requests = nginx
        .access_log(1)
        .iter()
        .filter(|(_, _, r)| r.contains("/game.pak"))
        .count();
    assert_eq!(requests, 1);
}

/// A small ext4 filesystem mounted on a loop device (root only), unmounted when dropped.
struct TinyDisk {
    mount: tempfile::TempDir,
    _image_dir: tempfile::TempDir,
}

impl TinyDisk {
    fn mount(megabytes: u32) -> Option<TinyDisk> {
        let uid = std::process::Command::new("id").arg("-u").output().ok()?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: the disk-full test must not skip"
            );
            eprintln!("SKIP: mounting a small filesystem needs root");
            return None;
        }
        let image_dir = tempfile::tempdir().expect("tempdir");
        let image = image_dir.path().join("disk.img");
        let file = std::fs::File::create(&image).expect("image");
        file.set_len(u64::from(megabytes) << 20).expect("size");
        let run = |cmd: &str, args: &[&str]| {
            let out = std::process::Command::new(cmd)
                .args(args)
                .output()
                .expect(cmd);
            assert!(
                out.status.success(),
                "{cmd} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let image_str = image.to_str().expect("path");
        run("mkfs.ext4", &["-q", "-F", image_str]);
        let mount = tempfile::tempdir().expect("tempdir");
        run(
            "mount",
            &[
                "-o",
                "loop",
                image_str,
                mount.path().to_str().expect("path"),
            ],
        );
        Some(TinyDisk {
            mount,
            _image_dir: image_dir,
        })
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.mount.path())
            .status();
    }
}

#[test]
fn full_disk_still_proxies_and_counts_store_errors() {
    let Some(_) = require("curl") else { return };
    let Some(disk) = TinyDisk::mount(8) else {
        return;
    };
    let big = pattern(12_000_000, 12);
    let small = pattern(1_000_000, 13);
    let origin = Origin::start(vec![
        ("/big.bin", resource(big.clone())),
        ("/small.bin", resource(small.clone())),
    ]);
    let server = start_server(&cache_yaml(&disk_storage(&disk.mount.path().join("cache"))));
    // 12 MB cannot be reserved on an 8 MiB filesystem: relayed whole, not stored.
    for _ in 0..2 {
        let got = fetch(&server, &origin.url("/big.bin"), &[]);
        assert_eq!(got.status, 200);
        assert_eq!(got.body, big);
        assert_eq!(x_cache(&got), "MISS");
    }
    let stats = server.api_get("/api/v1/cache/stats");
    assert_eq!(stats["store_errors"], 2, "{stats}");
    assert_eq!(stats["disk"]["entries"], 0);
    let log = server.logs.lock().expect("logs").join("\n");
    assert!(log.contains("No space left on device"), "{log}");
    // What fits is still cached.
    fetch(&server, &origin.url("/small.bin"), &[]);
    wait_stored(&server, "disk", 1);
    assert_eq!(
        x_cache(&fetch(&server, &origin.url("/small.bin"), &[])),
        "HIT"
    );
    drop(server);
    drop(disk);
}

#[test]
fn reload_applies_rules_and_reports_storage_changes_as_needing_a_restart() {
    let Some(_) = require("curl") else { return };
    let origin = Origin::start(vec![("/a", resource(pattern(2000, 3)))]);
    let server = start_server(&format!(
        "cache:\n  enabled: true\n  storage:\n{}\n",
        memory_storage("1MiB", "lru")
    ));
    let url = origin.url("/a");
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "", "no rule yet");
    // Same storage, a new rule: hot.
    let base = std::fs::read_to_string(&server.config_path).expect("config");
    let with_rule = format!("{base}  rules:\n    - {{ name: lan, domains: [\"127.0.0.1\"] }}\n");
    std::fs::write(&server.config_path, &with_rule).expect("write");
    let (status, body) = api_call(&server, "POST", "/api/v1/config/reload", None, None);
    assert_eq!(status, 200, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cache") && !message.contains("restart"),
        "{message}"
    );
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "MISS");
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "HIT");
    // A storage change is reported as needing a restart and not applied.
    std::fs::write(
        &server.config_path,
        with_rule.replace("max_size: 1MiB", "max_size: 2MiB"),
    )
    .expect("write");
    let (status, body) = api_call(&server, "POST", "/api/v1/config/reload", None, None);
    assert_eq!(status, 200, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("restart required for [cache]"),
        "{message}"
    );
    let stats = server.api_get("/api/v1/cache/stats");
    assert_eq!(stats["memory"]["max_size_bytes"], 1 << 20);
    assert_eq!(x_cache(&fetch(&server, &url, &[])), "HIT");
}

#[test]
fn cleanup_removes_a_damaged_disk_entry() {
    let Some(_) = require("curl") else { return };
    let body = pattern(300_000, 14);
    let origin = Origin::start(vec![("/rot.bin", resource(body.clone()))]);
    let disk = tempfile::tempdir().expect("tempdir");
    let storage = format!(
        "    type: disk\n    disk: {{ path: \"{}\", max_size: 1GiB, cleanup_interval: 1s }}",
        disk.path().display()
    );
    let server = start_server(&cache_yaml(&storage));
    let url = origin.url("/rot.bin");
    fetch(&server, &url, &[]);
    wait_stored(&server, "disk", 1);
    // Flip one body byte in the entry file, as bit rot would.
    let entry = std::fs::read_dir(disk.path())
        .expect("cache dir")
        .flatten()
        .filter(|d| d.file_name() != "tmp")
        .flat_map(|d| std::fs::read_dir(d.path()).expect("fan-out dir").flatten())
        .map(|f| f.path())
        .find(|p| p.extension().is_some_and(|e| e == "entry"))
        .expect("entry file");
    let mut bytes = std::fs::read(&entry).expect("read entry");
    let at = bytes.len() - 10;
    bytes[at] ^= 0xff;
    std::fs::write(&entry, &bytes).expect("write entry");
    wait_stored(&server, "disk", 0);
    let log = server.logs.lock().expect("logs").join("\n");
    assert!(log.contains("failed its checksum"), "{log}");
    let again = fetch(&server, &url, &[]);
    assert_eq!(x_cache(&again), "MISS");
    assert_eq!(again.body, body);
    assert_eq!(origin.count("/rot.bin"), 2);
}

/// The `.entry` files under a disk cache directory, with their sizes.
fn entry_files(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
    std::fs::read_dir(dir)
        .expect("cache dir")
        .flatten()
        .filter(|d| d.file_name() != "tmp" && d.path().is_dir())
        .flat_map(|d| std::fs::read_dir(d.path()).expect("fan-out dir").flatten())
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "entry"))
        .map(|p| {
            let len = std::fs::metadata(&p).map_or(0, |m| m.len());
            (p, len)
        })
        .collect()
}

fn shorten(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(len))
        .expect("truncate entry file");
}

#[test]
fn a_disk_entry_shortened_outside_the_cache_is_dropped_and_refetched() {
    let Some(_) = require("curl") else { return };
    let small = pattern(30_000, 21);
    let big = pattern(32_000_000, 22);
    let origin = Origin::start(vec![
        ("/small.bin", resource(small.clone())),
        ("/big.bin", resource(big.clone())),
    ]);
    let disk = tempfile::tempdir().expect("tempdir");
    let server = start_server(&cache_yaml(&disk_storage(disk.path())));
    fetch(&server, &origin.url("/small.bin"), &[]);
    fetch(&server, &origin.url("/big.bin"), &[]);
    wait_stored(&server, "disk", 2);
    let files = entry_files(disk.path());
    let small_file = files
        .iter()
        .find(|(_, l)| *l < 1_000_000)
        .expect("small entry");
    let big_file = files
        .iter()
        .find(|(_, l)| *l > 1_000_000)
        .expect("big entry");

    // Shortened before a hit: dropped and fetched again, whole.
    shorten(&small_file.0, small_file.1 / 2);
    let again = fetch(&server, &origin.url("/small.bin"), &[]);
    assert_eq!(x_cache(&again), "MISS");
    assert_eq!(again.body, small);
    assert_eq!(origin.count("/small.bin"), 2);

    // Shortened while served: a client with a small receive window reads the head and a little
    // of the body, the file shrinks, the client reads on.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(32 << 10).expect("rcvbuf");
    socket
        .connect(&server.http.into())
        .expect("connect to the proxy");
    let mut client: TcpStream = socket.into();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        client,
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        origin.url("/big.bin"),
        format_args!("127.0.0.1:{}", origin.port)
    )
    .expect("request");
    let mut first = vec![0u8; 64 << 10];
    let mut got = 0;
    while got < first.len() {
        let n = std::io::Read::read(&mut client, &mut first[got..]).expect("read");
        assert!(n > 0, "closed early");
        got += n;
    }
    assert!(first.starts_with(b"HTTP/1.1 200"), "a hit answers 200");
    shorten(&big_file.0, 8_000_000);
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut client, &mut rest);
    assert!(
        (got + rest.len()) < big.len(),
        "the response ends early: {} bytes",
        got + rest.len()
    );
    // The server is still alive, dropped the entry and fetches the object again.
    let again = fetch(&server, &origin.url("/big.bin"), &[]);
    assert_eq!(x_cache(&again), "MISS");
    assert!(again.body == big, "refetched body differs");
    assert_eq!(origin.count("/big.bin"), 2);
    let log = server.logs.lock().expect("logs").join("\n");
    assert!(log.contains("shrank while served"), "{log}");
}

/// Memory-tier bodies of 64 KiB and more are sealed in a memfd and sent with sendfile(2): full
/// hits (two on one keep-alive connection, the second after the socket went non-blocking),
/// single and multiple ranges all carry the stored bytes exactly; small bodies stay on the heap.
#[test]
fn memory_tier_hits_from_sealed_memfd_are_exact() {
    let Some(_) = require("curl") else { return };
    let big = pattern(8_000_000, 5);
    let medium = pattern(1 << 20, 9);
    let small = pattern(10_000, 3);
    let origin = Origin::start(vec![
        ("/big.bin", resource(big.clone())),
        ("/medium.bin", resource(medium.clone())),
        ("/small.bin", resource(small.clone())),
    ]);
    let server = start_server(&cache_yaml(&memory_storage("64MiB", "lru")));
    for (path, body) in [
        ("/big.bin", &big),
        ("/medium.bin", &medium),
        ("/small.bin", &small),
    ] {
        let miss = fetch(&server, &origin.url(path), &[]);
        assert_eq!(x_cache(&miss), "MISS");
        assert_eq!(&miss.body, body);
    }
    wait_stored(&server, "memory", 3);
    // One memfd per large body, none for the small one.
    let memfds = std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .expect("fd dir")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().contains("memfd:switchyard-cache"))
        .count();
    assert_eq!(memfds, 2);

    // Two full hits on one connection: curl reuses it for the second URL.
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let proxy = format!("http://{}", server.http);
    let out = curl(&[
        "-sS",
        "--max-time",
        "60",
        "-x",
        &proxy,
        "-w",
        "%{num_connects} ",
        &origin.url("/big.bin"),
        "-o",
        a.to_str().expect("path"),
        &origin.url("/medium.bin"),
        "-o",
        b.to_str().expect("path"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1 0");
    assert!(std::fs::read(&a).expect("a") == big, "big hit differs");
    assert!(
        std::fs::read(&b).expect("b") == medium,
        "medium hit differs"
    );

    let slice = fetch(&server, &origin.url("/big.bin"), &["-r", "7000000-7999999"]);
    assert_eq!(slice.status, 206);
    assert!(slice.body == big[7_000_000..], "range differs");
    let multi = fetch(
        &server,
        &origin.url("/medium.bin"),
        &["-r", "0-99,500000-700000"],
    );
    assert_eq!(multi.status, 206);
    let boundary = multi.headers["content-type"]
        .split("boundary=")
        .nth(1)
        .expect("boundary")
        .to_owned();
    let parts = split_multipart(&multi.body, &boundary);
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].1, &medium[..100]);
    assert_eq!(parts[1].1, &medium[500_000..=700_000]);
    assert_eq!(origin.count("/big.bin"), 1);
    assert_eq!(origin.count("/medium.bin"), 1);
}
