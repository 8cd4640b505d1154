//! `inventory` scenario: list latency of `switchyard inventory` for one user with 100,000 items,
//! on SQLite and (when the server binaries are installed) on PostgreSQL.
//!
//! Per engine: start the service on a free loopback port with its own data directory (a
//! throwaway PostgreSQL cluster for the second engine: `initdb` in the scenario's temp dir,
//! stopped by its PID afterwards), register an admin and then the measured user (a plain
//! `USER`, so every list is scoped to their items) and sign in, seed the items through the
//! import endpoint (10 documents of 10,000 items, 20 categories, 10 locations), then time
//! `GET /api/items` one request after another on one keep-alive connection: page 1 in the
//! default sort, two searches (a frequent manufacturer, a single barcode), a category filter,
//! the low-stock view and a deep page. Each query: a few warm-up requests, then
//! [`REQUESTS`] timed ones → p50, p99, max.
//!
//! Results: `<out>/inventory.json` and a section of `summary.md`; target: p99 of page 1 below
//! 50 ms (the issue asks for "well under 50 ms").

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::procs::{free_port, tail, Procs};
use crate::report::{f, table, verdict};
use crate::scenarios::Ctx;

/// Items of the benchmark user.
pub const ITEMS: usize = 100_000;
/// Items per import document.
const BATCH: usize = 10_000;
/// Timed requests per query (after [`WARMUP`] untimed ones).
pub const REQUESTS: usize = 200;
const WARMUP: usize = 10;
/// Target for the p99 of page 1, milliseconds.
const TARGET_MS: f64 = 50.0;

const CATEGORIES: usize = 20;
const LOCATIONS: usize = 10;
const MANUFACTURERS: [&str; 10] = [
    "Bosch",
    "Makita",
    "DeWalt",
    "Hilti",
    "Festool",
    "Metabo",
    "Ryobi",
    "Milwaukee",
    "Stanley",
    "Wera",
];

#[derive(Debug, Clone, Serialize)]
struct Latency {
    query: String,
    path: String,
    /// `pagination.total` of the answer (how many items match).
    matches: i64,
    requests: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    mean_ms: f64,
    response_bytes: usize,
}

#[derive(Debug, Clone, Serialize)]
struct EngineResult {
    engine: &'static str,
    version: Option<String>,
    seed_seconds: Option<f64>,
    latencies: Vec<Latency>,
    error: Option<String>,
}

// ------------------------------------------------------------------ a minimal HTTP/1.1 client

/// One keep-alive HTTP/1.1 connection with the cookies the service set. Enough for JSON
/// requests and answers with `Content-Length` (what the service sends), so a timed request is
/// one write and one read on an open socket, nothing else.
struct Conn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    cookies: Vec<(String, String)>,
}

struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "HTTP {}: not JSON: {}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(200)])
            )
        })
    }
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn> {
        let s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(600)))?;
        Ok(Conn {
            addr,
            reader: BufReader::new(s),
            cookies: Vec::new(),
        })
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
        extra: &[(&str, &str)],
    ) -> Result<Answer> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n",
            self.addr
        );
        if !self.cookies.is_empty() {
            let _ = write!(head, "Cookie: {}\r\n", self.cookie_header());
        }
        for (k, v) in extra {
            let _ = write!(head, "{k}: {v}\r\n");
        }
        if let Some((ct, b)) = body {
            let _ = write!(
                head,
                "Content-Type: {ct}\r\nContent-Length: {}\r\n",
                b.len()
            );
        }
        head.push_str("\r\n");
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        if let Some((_, b)) = body {
            stream.write_all(b)?;
        }
        self.read_answer()
    }

    fn read_answer(&mut self) -> Result<Answer> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {line:?}"))?;
        let mut len: Option<usize> = None;
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                bail!("connection closed in the response head");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                len = Some(v.parse().context("content-length")?);
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                bail!("chunked responses are not expected here");
            } else if k.eq_ignore_ascii_case("set-cookie") {
                if let Some((name, value)) = v.split(';').next().and_then(|c| c.split_once('=')) {
                    self.cookies.retain(|(n, _)| n != name);
                    if !value.is_empty() {
                        self.cookies.push((name.to_string(), value.to_string()));
                    }
                }
            }
        }
        let mut body = vec![0u8; len.unwrap_or(0)];
        self.reader.read_exact(&mut body)?;
        Ok(Answer { status, body })
    }
}

// ------------------------------------------------------------------ PostgreSQL

/// A throwaway PostgreSQL cluster in `dir`, stopped by its postmaster PID on drop.
struct Postgres {
    data: PathBuf,
    port: u16,
    version: String,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn pg_bin() -> Option<PathBuf> {
    fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists())
        .max()
}

fn pg_cmd(bin: &Path, prog: &str) -> Command {
    if is_root() {
        // PostgreSQL refuses to run as root.
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(prog));
        c
    } else {
        Command::new(bin.join(prog))
    }
}

impl Postgres {
    fn start(bin: &Path, dir: &Path) -> Result<Postgres> {
        fs::create_dir_all(dir)?;
        if is_root() {
            let ok = Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir)
                .status()?
                .success();
            if !ok {
                bail!("chown {} postgres", dir.display());
            }
        }
        let data = dir.join("data");
        let out = pg_cmd(bin, "initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .output()?;
        if !out.status.success() {
            bail!("initdb: {}", String::from_utf8_lossy(&out.stderr));
        }
        let port = free_port()?;
        // Durability settings as shipped (fsync on): the bench measures reads, but keep the
        // server as a deployment would run it.
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c shared_buffers=128MB",
            dir.display()
        );
        let out = pg_cmd(bin, "pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-o", &opts, "-w", "-t", "60", "-l"])
            .arg(dir.join("server.log"))
            .arg("start")
            .output()?;
        if !out.status.success() {
            bail!(
                "pg_ctl start: {} {}",
                String::from_utf8_lossy(&out.stderr),
                tail(&dir.join("server.log"), 5)
            );
        }
        let version = Command::new(bin.join("postgres"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        Ok(Postgres {
            data,
            port,
            version,
        })
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let pid = fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
            .and_then(rustix::process::Pid::from_raw);
        let Some(pid) = pid else { return };
        // SIGINT: fast shutdown.
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{}", pid.as_raw_nonzero())).exists()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

// ------------------------------------------------------------------ the scenario

/// The `n`-th import document: `BATCH` items (ids and barcodes unique across documents).
fn import_document(n: usize) -> Value {
    let cat_id = |i: usize| format!("00000000-0000-4000-8000-{:012}", i);
    let loc_id = |i: usize| format!("00000000-0000-4000-9000-{:012}", i);
    let categories: Vec<Value> = (0..CATEGORIES)
        .map(|i| json!({"id": cat_id(i), "name": format!("Category {i:02}"), "color": "#6366f1"}))
        .collect();
    let locations: Vec<Value> = (0..LOCATIONS)
        .map(|i| json!({"id": loc_id(i), "name": format!("Shelf {i:02}"), "description": "rack"}))
        .collect();
    let items: Vec<Value> = (n * BATCH..(n + 1) * BATCH)
        .map(|k| {
            // deterministic spread: quantity 0..19, minimum 0..4 (about 15 % low stock)
            let h = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            json!({
                "name": format!("Part {k:06} {}", ["bolt", "drill bit", "saw blade", "battery", "charger"][k % 5]),
                "description": format!("bench item {k} in batch {n}"),
                "manufacturer": MANUFACTURERS[k % MANUFACTURERS.len()],
                "barcode": format!("SKU-{k:07}"),
                "buyPrice": (h % 10_000) as f64 / 100.0,
                "buyDate": "2024-05-01",
                "quantity": h % 20,
                "minQuantity": (h >> 8) % 5,
                "categoryId": cat_id(k % CATEGORIES),
                "locationId": loc_id(k % LOCATIONS),
            })
        })
        .collect();
    json!({"format": "switchyard-inventory", "version": 1, "categories": categories,
           "locations": locations, "items": items})
}

/// Nearest-rank percentile `p` (0..=100) of ascending `sorted`; 0 when empty.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn measure(conn: &mut Conn, query: &str, path: &str) -> Result<Latency> {
    let mut last = None;
    for _ in 0..WARMUP {
        last = Some(conn.request("GET", path, None, &[])?);
    }
    let mut times = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let a = conn.request("GET", path, None, &[])?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        if a.status != 200 {
            bail!("GET {path}: HTTP {}", a.status);
        }
        last = Some(a);
    }
    let last = last.context("no answer")?;
    let v = last.json()?;
    times.sort_by(f64::total_cmp);
    Ok(Latency {
        query: query.to_string(),
        path: path.to_string(),
        matches: v["pagination"]["total"].as_i64().unwrap_or(-1),
        requests: REQUESTS,
        p50_ms: percentile(&times, 50.0),
        p99_ms: percentile(&times, 99.0),
        max_ms: times.last().copied().unwrap_or(0.0),
        mean_ms: times.iter().sum::<f64>() / times.len().max(1) as f64,
        response_bytes: last.body.len(),
    })
}

fn run_engine(
    ctx: &Ctx,
    dir: &Path,
    engine: &'static str,
    database_url: Option<String>,
) -> Result<(f64, Vec<Latency>)> {
    fs::create_dir_all(dir)?;
    let mut procs = Procs::default();
    let port = free_port()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut cmd = Command::new(&ctx.switchyard);
    cmd.args(["inventory", "--listen", &addr.to_string(), "--data-dir"])
        .arg(dir.join("data"))
        .env("RUST_LOG", "warn")
        .env("AUTH_SECRET", "bench-secret-bench-secret-bench-secret-0123")
        .env_remove("DATABASE_URL");
    if let Some(u) = &database_url {
        cmd.env("DATABASE_URL", u);
    }
    let log = dir.join("inventory.log");
    let pid = procs.spawn_under_test(&format!("switchyard inventory ({engine})"), cmd, &log)?;
    procs
        .wait_port(pid, addr, Duration::from_secs(30))
        .map_err(|e| anyhow::anyhow!("{e}; log: {}", tail(&log, 5)))?;

    let mut c = Conn::open(addr)?;
    let csrf = c.request("GET", "/api/auth/csrf", None, &[])?.json()?["csrfToken"]
        .as_str()
        .context("csrfToken")?
        .to_string();
    // The first account becomes ADMIN (lists everyone's items); the measured user is a plain
    // USER, whose lists are scoped to their own 100,000 items.
    for email in ["admin@example.org", "bench@example.org"] {
        let account = json!({"email": email, "password": "bench-password",
                             "confirmPassword": "bench-password"});
        let r = c.request(
            "POST",
            "/api/auth/register",
            Some(("application/json", account.to_string().as_bytes())),
            &[],
        )?;
        if r.status != 201 {
            bail!(
                "register: HTTP {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
    }
    let signin =
        json!({"email": "bench@example.org", "password": "bench-password", "csrfToken": csrf});
    let r = c.request(
        "POST",
        "/api/auth/callback/credentials",
        Some(("application/json", signin.to_string().as_bytes())),
        &[],
    )?;
    if r.status != 302 {
        bail!(
            "sign-in: HTTP {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    // The CSRF token is bound to the session: sign-in answers with the new one.
    let csrf = r.json()?["csrfToken"]
        .as_str()
        .context("csrfToken after sign-in")?
        .to_string();

    let seed_start = Instant::now();
    for n in 0..ITEMS / BATCH {
        tracing::info!(
            "inventory ({engine}): importing items {}..{}",
            n * BATCH,
            (n + 1) * BATCH
        );
        let doc = serde_json::to_vec(&import_document(n))?;
        let r = c.request(
            "POST",
            "/api/import",
            Some(("application/json", &doc)),
            &[("X-CSRF-Token", &csrf)],
        )?;
        if r.status != 200 {
            bail!(
                "import {n}: HTTP {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
    }
    let seed = seed_start.elapsed().as_secs_f64();
    let total = c.request("GET", "/api/items?limit=1", None, &[])?.json()?["pagination"]["total"]
        .as_i64()
        .unwrap_or(0);
    if total != ITEMS as i64 {
        bail!("after seeding the user has {total} items, not {ITEMS}");
    }
    let cats = c.request("GET", "/api/categories", None, &[])?.json()?;
    let cat = cats["categories"][3]["id"]
        .as_str()
        .context("a category id")?
        .to_string();

    let queries = [
        (
            "page 1, default sort (createdAt desc)",
            "/api/items".to_string(),
        ),
        (
            "page 1 sorted by name",
            "/api/items?sortBy=name&sortOrder=asc".to_string(),
        ),
        (
            "search \"makita\" (10 % of items)",
            "/api/items?search=makita".to_string(),
        ),
        (
            "search one barcode",
            "/api/items?search=SKU-0077777".to_string(),
        ),
        (
            "category filter (5 %)",
            format!("/api/items?categoryId={cat}"),
        ),
        ("lowStock=true", "/api/items?lowStock=true".to_string()),
        ("deep page (page 2500)", "/api/items?page=2500".to_string()),
    ];
    let mut out = Vec::new();
    for (label, path) in queries {
        tracing::info!("inventory ({engine}): timing {label}");
        out.push(measure(&mut c, label, &path)?);
    }
    Ok((seed, out))
}

pub fn run(ctx: &Ctx) -> Result<String> {
    let dir = ctx.env.dir.join("inventory");
    fs::create_dir_all(&dir)?;
    let mut results = Vec::new();

    let sqlite = run_engine(ctx, &dir.join("sqlite"), "SQLite", None);
    results.push(match sqlite {
        Ok((seed, latencies)) => EngineResult {
            engine: "SQLite",
            version: None,
            seed_seconds: Some(seed),
            latencies,
            error: None,
        },
        Err(e) => EngineResult {
            engine: "SQLite",
            version: None,
            seed_seconds: None,
            latencies: Vec::new(),
            error: Some(format!("{e:#}")),
        },
    });

    let mut pg_result = EngineResult {
        engine: "PostgreSQL",
        version: None,
        seed_seconds: None,
        latencies: Vec::new(),
        error: None,
    };
    match pg_bin() {
        None => {
            pg_result.error = Some("no PostgreSQL server installed (apt install postgresql)".into())
        }
        Some(bin) => match Postgres::start(&bin, &dir.join("pg")) {
            Err(e) => pg_result.error = Some(format!("{e:#}")),
            Ok(pg) => {
                pg_result.version = Some(pg.version.clone());
                match run_engine(ctx, &dir.join("pg-service"), "PostgreSQL", Some(pg.url())) {
                    Ok((seed, l)) => {
                        pg_result.seed_seconds = Some(seed);
                        pg_result.latencies = l;
                    }
                    Err(e) => pg_result.error = Some(format!("{e:#}")),
                }
            }
        },
    }
    results.push(pg_result);

    let path = ctx.out.join("inventory.json");
    let doc = json!({
        "scenario": "inventory",
        "items": ITEMS,
        "requests_per_query": REQUESTS,
        "date": chrono::Local::now().to_rfc3339(),
        "load_average_end": crate::scenarios::loadavg(),
        "results": results,
    });
    fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("write {}", path.display()))?;
    Ok(markdown(&results))
}

fn markdown(results: &[EngineResult]) -> String {
    let mut s = String::from("## inventory\n\n");
    let _ = writeln!(
        s,
        "`GET /api/items` for one user with {ITEMS} items (20 per page), {REQUESTS} sequential \
         requests per query on one keep-alive connection after {WARMUP} warm-up requests. \
         Target: page 1 p99 < {TARGET_MS} ms.\n"
    );
    for r in results {
        let _ = writeln!(
            s,
            "### {}{}\n",
            r.engine,
            r.version
                .as_deref()
                .map(|v| format!(" ({v})"))
                .unwrap_or_default()
        );
        if let Some(e) = &r.error {
            let _ = writeln!(s, "Not measured: {}\n", e.replace('\n', " "));
            continue;
        }
        if let Some(seed) = r.seed_seconds {
            let _ = writeln!(
                s,
                "Seeding {ITEMS} items through `POST /api/import`: {seed:.1} s\n"
            );
        }
        let rows: Vec<Vec<String>> = r
            .latencies
            .iter()
            .map(|l| {
                vec![
                    l.query.clone(),
                    l.matches.to_string(),
                    f(l.p50_ms, 2),
                    f(l.p99_ms, 2),
                    f(l.max_ms, 2),
                    l.response_bytes.to_string(),
                ]
            })
            .collect();
        s.push_str(&table(
            &["query", "matches", "p50 ms", "p99 ms", "max ms", "bytes"],
            &rows,
        ));
        if let Some(first) = r.latencies.first() {
            let _ = writeln!(
                s,
                "\nPage 1 p99 {} ms < {TARGET_MS} ms: {}\n",
                f(first.p99_ms, 2),
                verdict(first.p99_ms < TARGET_MS)
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn import_documents_have_unique_barcodes() {
        let a = import_document(0);
        let b = import_document(1);
        assert_eq!(a["items"].as_array().map(Vec::len), Some(BATCH));
        assert_ne!(a["items"][0]["barcode"], b["items"][0]["barcode"]);
        assert_eq!(a["categories"], b["categories"]);
    }
}
