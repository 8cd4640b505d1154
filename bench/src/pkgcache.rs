//! `pkgcache` scenario: `switchyard pkgcache` against nginx serving the same files from disk
//! (the practical limit for GET; nginx with `dav_methods PUT` for uploads), in the same run.
//!
//! - GET: `wrk` on one package of 10 KiB, 10 MiB and 1 GiB (fewer connections for 1 GiB).
//! - PUT: `wrk` with a Lua script that uploads to a fresh key per request (10 KiB, 10 MiB); for
//!   1 GiB, concurrent `curl -T` uploads. pkgcache hashes and fsyncs every upload before answering
//!   200, nginx's DAV module does neither, so PUT figures are not like for like (noted in the
//!   table).
//! - switchyard's peak RSS is sampled every 100 ms through the whole scenario.
//!
//! Results: `<out>/pkgcache.json` and a section of `summary.md` with the GET ratio against nginx
//! (target ≥ 80 %). Each measurement lasts `min(--seconds, 5)` s so the scenario stays around two
//! minutes.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::json;

use crate::peers::deb_version;
use crate::procs::{free_port, rss_kib, tail, which, Procs};
use crate::report::{f, table, verdict};
use crate::scenarios::Ctx;
use crate::wrk::HttpFigures;

const SIZES: [(&str, u64); 3] = [
    ("10 KiB", 10 * 1024),
    ("10 MiB", 10 * 1024 * 1024),
    ("1 GiB", 1024 * 1024 * 1024),
];

/// Connections of the 1 GiB GET (each response is 1 GiB).
const BIG_GET_CONNS: u32 = 4;
/// Seconds of the 1 GiB GET (long enough for several whole responses).
const BIG_GET_SECONDS: u64 = 8;

/// Concurrent 1 GiB uploads per program.
const BIG_PUTS: usize = 2;

#[derive(Debug, Clone, Serialize)]
struct Row {
    op: &'static str,
    size: &'static str,
    program: &'static str,
    connections: u32,
    figures: Option<HttpFigures>,
    error: Option<String>,
}

fn sha_for(i: u64) -> String {
    format!("{i:064x}")
}

fn write_file(path: &Path, len: u64) -> Result<()> {
    let mut file = fs::File::create(path)?;
    let mut block = vec![0u8; 1 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ len;
    for b in block.iter_mut() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *b = (x >> 56) as u8;
    }
    let mut left = len;
    let mut i = 0u64;
    while left > 0 {
        block[..8].copy_from_slice(&i.to_le_bytes());
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n])?;
        left -= n as u64;
        i += 1;
    }
    Ok(())
}

fn start_nginx(procs: &mut Procs, dir: &Path, www: &Path, cpus: usize) -> Result<SocketAddr> {
    let bin = which("nginx").context("nginx is not installed")?;
    let d = dir.join("nginx");
    fs::create_dir_all(&d)?;
    let port = free_port()?;
    let conf = format!(
        "user root;\nworker_processes {cpus};\ndaemon off;\nmaster_process on;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 8192; multi_accept on; }}\n\
         http {{\n  access_log off;\n  sendfile on; tcp_nopush on; tcp_nodelay on;\n\
           keepalive_requests 1000000; keepalive_timeout 120s;\n\
           default_type application/octet-stream;\n\
           client_body_temp_path {www}/.tmp; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;\n\
           uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           server {{ listen 127.0.0.1:{port}; root {www};\n\
             location /upload/ {{ dav_methods PUT; create_full_put_path on; client_max_body_size 0; }} }}\n}}\n",
        d = d.display(),
        www = www.display(),
    );
    fs::create_dir_all(www.join(".tmp"))?;
    let conf_path = d.join("nginx.conf");
    fs::write(&conf_path, conf)?;
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(&d)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(d.join("error.log"));
    let pid = procs.spawn_under_test("nginx", cmd, &d.join("stderr.log"))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    procs
        .wait_port(pid, addr, Duration::from_secs(15))
        .map_err(|e| anyhow::anyhow!("{e}; log: {}", tail(&d.join("error.log"), 5)))?;
    Ok(addr)
}

fn start_pkgcache(procs: &mut Procs, bin: &Path, dir: &Path) -> Result<(u32, SocketAddr)> {
    let port = free_port()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut cmd = Command::new(bin);
    cmd.args(["pkgcache", "--listen", &addr.to_string(), "--data-dir"])
        .arg(dir.join("store"))
        .env("RUST_LOG", "warn");
    let log = dir.join("pkgcache.log");
    let pid = procs.spawn_under_test("switchyard pkgcache", cmd, &log)?;
    procs
        .wait_port(pid, addr, Duration::from_secs(15))
        .map_err(|e| anyhow::anyhow!("{e}; log: {}", tail(&log, 5)))?;
    Ok((pid, addr))
}

fn curl_put(url: &str, file: &Path) -> Result<()> {
    let out = Command::new("curl")
        .args(["-sS", "-f", "-o", "/dev/null", "-X", "PUT", "-T"])
        .arg(file)
        .arg(url)
        .output()
        .context("run curl")?;
    if !out.status.success() {
        bail!("PUT {url}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// GET `url` and check status 200 and the byte count.
fn check_get(url: &str, len: u64) -> Result<()> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{size_download}",
            url,
        ])
        .output()
        .context("run curl")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim() != format!("200 {len}") {
        bail!("GET {url}: {text} (expected 200 {len})");
    }
    Ok(())
}

/// Lua for uploads of `len` bytes to fresh keys under `prefix`.
fn put_lua(prefix: &str, len: u64) -> String {
    format!(
        r#"
local counter = 0
local threads = 0
setup = function(thread) thread:set("tid", threads); threads = threads + 1 end
init = function(args) body = string.rep("x", {len}) end
request = function()
  counter = counter + 1
  local path = string.format("{prefix}/%d/%064x", tid, counter)
  return wrk.format("PUT", path, {{["Content-Type"] = "application/octet-stream"}}, body)
end
"#
    )
}

/// Runs wrk; `bytes_per_response` is filled from the response bytes (for PUT, `body_len`
/// accounts the upload instead).
fn run_wrk(
    dir: &Path,
    url: &str,
    script: &str,
    name: &str,
    connections: u32,
    seconds: u64,
    body_len: Option<u64>,
) -> Result<HttpFigures> {
    let path = dir.join(format!("{name}.lua"));
    fs::write(&path, format!("{script}\n{}", crate::wrk::DONE_LUA))?;
    let out = Command::new("wrk")
        .arg("-t2")
        .arg(format!("-c{}", connections.max(2)))
        .arg(format!("-d{seconds}s"))
        .args(["--latency", "--timeout", "60s", "-s"])
        .arg(&path)
        .arg(url)
        .output()
        .context("run wrk")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    crate::wrk::parse_summary(&stdout, body_len)
        .with_context(|| format!("wrk: {}", String::from_utf8_lossy(&out.stderr).trim()))
}

/// `n` concurrent `curl -T file` uploads to `urls`; figures over the wall time of all of them.
fn parallel_puts(urls: &[String], file: &Path, len: u64) -> Result<HttpFigures> {
    let started = Instant::now();
    let handles: Vec<_> = urls
        .iter()
        .map(|u| {
            let (u, file) = (u.clone(), file.to_path_buf());
            std::thread::spawn(move || {
                let t = Instant::now();
                curl_put(&u, &file).map(|()| t.elapsed())
            })
        })
        .collect();
    let mut lat = Vec::new();
    for h in handles {
        match h.join() {
            Ok(r) => lat.push(r?),
            Err(_) => bail!("upload thread panicked"),
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let n = urls.len() as u64;
    let max = lat.last().copied().unwrap_or_default();
    Ok(HttpFigures {
        requests: n,
        bytes: n * len,
        duration_s: secs,
        requests_per_sec: n as f64 / secs,
        transfer_mib_per_sec: (n * len) as f64 / secs / (1024.0 * 1024.0),
        p50_ms: lat.get(lat.len() / 2).copied().map(ms).unwrap_or(0.0),
        p90_ms: ms(max),
        p99_ms: ms(max),
        mean_ms: lat.iter().map(|d| ms(*d)).sum::<f64>() / lat.len().max(1) as f64,
        max_ms: ms(max),
        errors_connect: 0,
        errors_read: 0,
        errors_write: 0,
        errors_timeout: 0,
        non_2xx: 0,
        bytes_per_response: len as f64,
        cpu: None,
    })
}

/// RSS of `pid` plus its direct children (nginx workers), KiB.
pub(crate) fn tree_rss_kib(pid: u32) -> u64 {
    rss_kib(pid).unwrap_or(0)
        + children(pid)
            .into_iter()
            .map(|c| rss_kib(c).unwrap_or(0))
            .sum::<u64>()
}

/// CPU seconds (user + system) of `pid` plus its direct children (nginx workers, varnish's
/// cache process).
pub(crate) fn tree_cpu_seconds(pid: u32) -> f64 {
    crate::wireguard::cpu_seconds(pid)
        + children(pid)
            .into_iter()
            .map(crate::wireguard::cpu_seconds)
            .sum::<f64>()
}

/// The direct children of `pid`, from `/proc/*/stat`.
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let stat = fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(pid) {
                found.push(child);
            }
        }
    }
    found
}

pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<()>,
    peaks: Vec<Arc<AtomicU64>>,
}

pub(crate) fn sample(pids: &[u32]) -> Sampler {
    let stop = Arc::new(AtomicBool::new(false));
    let peaks: Vec<Arc<AtomicU64>> = pids.iter().map(|_| Arc::default()).collect();
    let (s, p, pids) = (stop.clone(), peaks.clone(), pids.to_vec());
    let handle = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            for (pid, peak) in pids.iter().zip(&p) {
                peak.fetch_max(tree_rss_kib(*pid), Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    Sampler {
        stop,
        handle,
        peaks,
    }
}

impl Sampler {
    pub(crate) fn finish(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
        self.peaks
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .collect()
    }
}

/// Runs the scenario and returns its Markdown section.
pub fn run(ctx: &Ctx) -> Result<String> {
    if which("wrk").is_none() {
        bail!("wrk is not installed");
    }
    if which("curl").is_none() {
        bail!("curl is not installed");
    }
    let seconds = ctx.seconds.min(5);
    let dir: PathBuf = ctx.env.dir.join("pkgcache");
    let www = dir.join("www");
    let files = dir.join("files");
    fs::create_dir_all(&www)?;
    fs::create_dir_all(&files)?;
    let mut procs = Procs::default();
    // nginx is the peer compared here, so it runs (and sizes its workers) on the under-test CPUs
    let nginx = start_nginx(&mut procs, &dir, &www, ctx.env.test_cpus)?;
    let nginx_pid = {
        let text = fs::read_to_string(dir.join("nginx/nginx.pid")).unwrap_or_default();
        text.trim().parse::<u32>().unwrap_or(0)
    };
    let (pid, pk) = start_pkgcache(&mut procs, &ctx.switchyard, &dir)?;
    let sampler = sample(&[pid, nginx_pid]);

    // Seed: one package per size, in pkgcache (through its API) and in nginx's root.
    let mut paths = Vec::new();
    for (i, (label, len)) in SIZES.iter().enumerate() {
        tracing::info!("pkgcache: preparing the {label} package");
        let file = files.join(format!("{i}.bin"));
        write_file(&file, *len)?;
        let path = format!("/bench{i}/1.0/{}", sha_for(i as u64 + 1));
        curl_put(&format!("http://{pk}{path}"), &file)?;
        let target = www.join(path.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::hard_link(&file, &target).or_else(|_| fs::copy(&file, &target).map(|_| ()))?;
        check_get(&format!("http://{pk}{path}"), *len)?;
        check_get(&format!("http://{nginx}{path}"), *len)?;
        paths.push((file, path));
    }

    let programs: [(&'static str, SocketAddr, &str); 2] =
        [("switchyard pkgcache", pk, ""), ("nginx", nginx, "/upload")];
    let mut rows: Vec<Row> = Vec::new();
    for ((label, len), (file, path)) in SIZES.iter().zip(&paths) {
        let big = *len >= 1 << 30;
        let conns = if big {
            ctx.connections.min(BIG_GET_CONNS)
        } else {
            ctx.connections
        };
        for (name, addr, _) in &programs {
            tracing::info!("pkgcache: GET {label} from {name}");
            let r = run_wrk(
                &dir,
                &format!("http://{addr}{path}"),
                "",
                &format!("get-{}", addr.port()),
                conns,
                if big { BIG_GET_SECONDS } else { seconds },
                None,
            );
            let mut row = Row {
                op: "GET",
                size: label,
                program: name,
                connections: conns,
                figures: None,
                error: None,
            };
            match r {
                Ok(fig) if fig.non_2xx > 0 => {
                    row.error = Some(format!("{} non-2xx responses", fig.non_2xx));
                    row.figures = Some(fig);
                }
                Ok(fig) if fig.requests > 0 && fig.bytes_per_response < *len as f64 => {
                    row.error = Some(format!("{:.0} bytes per response", fig.bytes_per_response));
                    row.figures = Some(fig);
                }
                Ok(fig) => row.figures = Some(fig),
                Err(e) => row.error = Some(format!("{e:#}")),
            }
            rows.push(row);
        }
        for (round, (name, addr, prefix)) in programs.iter().enumerate() {
            tracing::info!("pkgcache: PUT {label} to {name}");
            let r = if *len >= 1 << 30 {
                let urls: Vec<String> = (0..BIG_PUTS)
                    .map(|k| {
                        format!(
                            "http://{addr}{prefix}/bigput/1/{}",
                            sha_for(1000 + k as u64)
                        )
                    })
                    .collect();
                parallel_puts(&urls, file, *len).map(|fig| (fig, BIG_PUTS as u32))
            } else {
                run_wrk(
                    &dir,
                    &format!("http://{addr}/"),
                    &put_lua(&format!("{prefix}/put{round}"), *len),
                    &format!("put-{}-{len}", addr.port()),
                    conns,
                    seconds,
                    Some(*len),
                )
                .map(|fig| (fig, conns))
            };
            let mut row = Row {
                op: "PUT",
                size: label,
                program: name,
                connections: conns,
                figures: None,
                error: None,
            };
            match r {
                Ok((fig, c)) => {
                    row.connections = c;
                    if fig.non_2xx > 0 {
                        row.error = Some(format!("{} non-2xx responses", fig.non_2xx));
                    }
                    row.figures = Some(fig);
                }
                Err(e) => row.error = Some(format!("{e:#}")),
            }
            rows.push(row);
            // Free the disk for the next measurement.
            let _ = fs::remove_dir_all(www.join("upload"));
            let _ = fs::remove_dir_all(dir.join("store/packages/bigput"));
            for entry in fs::read_dir(dir.join("store/packages"))?.flatten() {
                if entry.file_name().to_string_lossy().starts_with("put") {
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    let peaks = sampler.finish();
    let (pk_peak, nginx_peak) = (
        peaks.first().copied().unwrap_or(0),
        peaks.get(1).copied().unwrap_or(0),
    );
    drop(procs);
    let _ = fs::remove_dir_all(&dir);

    let nginx_version = deb_version("nginx");
    let get_ratio = |size: &str| {
        let pick = |p: &str| {
            rows.iter()
                .find(|r| r.op == "GET" && r.size == size && r.program == p && r.error.is_none())
                .and_then(|r| r.figures.as_ref())
                .map(|f| (f.requests_per_sec, f.transfer_mib_per_sec))
        };
        match (pick("switchyard pkgcache"), pick("nginx")) {
            // Small packages: requests/s; large ones: bytes/s (a 1 GiB response barely completes).
            (Some(s), Some(n)) if size == "10 KiB" && n.0 > 0.0 => Some(s.0 / n.0),
            (Some(s), Some(n)) if n.1 > 0.0 => Some(s.1 / n.1),
            _ => None,
        }
    };
    let ratios: Vec<(&str, Option<f64>)> = SIZES.iter().map(|(l, _)| (*l, get_ratio(l))).collect();
    let json_out = json!({
        "scenario": "pkgcache",
        "params": { "seconds": seconds, "connections": ctx.connections, "connections_1gib": ctx.connections.min(BIG_GET_CONNS), "seconds_1gib": BIG_GET_SECONDS,
                    "big_put_clients": BIG_PUTS, "tool": "wrk -t2 (GET, PUT ≤ 10 MiB), curl -T (PUT 1 GiB)" },
        "nginx_version": nginx_version,
        "peak_rss_kib": { "switchyard_pkgcache": pk_peak, "nginx_master_and_workers": nginx_peak },
        "get_ratio_vs_nginx": ratios.iter().map(|(l, r)| json!({"size": l, "ratio": r})).collect::<Vec<_>>(),
        "results": rows,
        "date": chrono::Local::now().to_rfc3339(),
        "cpus": ctx.env.cpus,
    });
    let path = ctx.out.join("pkgcache.json");
    fs::write(&path, serde_json::to_string_pretty(&json_out)?)
        .with_context(|| format!("write {}", path.display()))?;

    let mut md = format!(
        "## pkgcache (vcpkg binary cache) vs nginx from disk\n\n\
         wrk -t2, {seconds} s per measurement, {} connections ({} for 1 GiB GET, {BIG_GET_SECONDS} s); 1 GiB PUT = {BIG_PUTS} concurrent `curl -T`. \
         nginx {} ({} workers, sendfile on, PUT via dav_methods). pkgcache hashes (SHA-256) and fsyncs each upload before \
         answering; nginx does neither, so PUT rows are not like for like.\n\n",
        ctx.connections,
        ctx.connections.min(BIG_GET_CONNS),
        nginx_version.as_deref().unwrap_or("?"),
        ctx.env.cpus,
    );
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut v = vec![
                r.op.to_string(),
                r.size.to_string(),
                r.program.to_string(),
                r.connections.to_string(),
            ];
            match &r.figures {
                Some(x) => v.extend([
                    f(x.requests_per_sec, 1),
                    f(x.transfer_mib_per_sec, 1),
                    f(x.p50_ms, 2),
                    f(x.p99_ms, 2),
                ]),
                None => v.extend(std::iter::repeat_n("–".to_string(), 4)),
            }
            v.push(match &r.error {
                Some(e) => format!("FAILED: {}", e.replace('|', "/")),
                None => "ok".into(),
            });
            v
        })
        .collect();
    md.push_str(&table(
        &[
            "op", "size", "program", "conns", "req/s", "MiB/s", "p50 ms", "p99 ms", "status",
        ],
        &table_rows,
    ));
    md.push('\n');
    for (label, r) in &ratios {
        match r {
            Some(r) => {
                let _ = writeln!(
                    md,
                    "- GET {label}: pkgcache / nginx = **{:.0} %** {} — target ≥ 80 %: {}",
                    r * 100.0,
                    if *label == "10 KiB" { "req/s" } else { "MiB/s" },
                    verdict(*r >= 0.8)
                );
            }
            None => {
                let _ = writeln!(md, "- GET {label}: ratio n/a (a measurement failed)");
            }
        }
    }
    let _ = writeln!(
        md,
        "- peak RSS over the whole scenario: switchyard pkgcache **{:.1} MiB**; nginx master + workers {:.1} MiB\n",
        pk_peak as f64 / 1024.0,
        nginx_peak as f64 / 1024.0
    );
    Ok(md)
}
