//! HTTP load with `wrk`, directly or through a forward proxy (absolute-form request line set by a
//! Lua script), plus a byte-exact check that a proxy really forwards the file.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// What one wrk run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HttpFigures {
    pub requests: u64,
    pub bytes: u64,
    pub duration_s: f64,
    pub requests_per_sec: f64,
    pub transfer_mib_per_sec: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
    pub errors_connect: u64,
    pub errors_read: u64,
    pub errors_write: u64,
    pub errors_timeout: u64,
    /// Responses that were not 2xx/3xx (must be 0).
    pub non_2xx: u64,
    /// Average bytes read per response (must be at least the file size).
    pub bytes_per_response: f64,
    /// CPU per request of the proxy, origin and wrk (filled in by the `http` scenario).
    #[serde(default)]
    pub cpu: Option<crate::procs::CpuPerUnit>,
}

impl HttpFigures {
    pub fn socket_errors(&self) -> u64 {
        self.errors_connect + self.errors_read + self.errors_write + self.errors_timeout
    }
}

#[derive(Deserialize)]
struct Raw {
    requests: u64,
    bytes: u64,
    duration_us: f64,
    err_connect: u64,
    err_read: u64,
    err_write: u64,
    err_status: u64,
    err_timeout: u64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    mean_us: f64,
    max_us: f64,
}

/// A wrk `done` hook printing the summary as one `WRKJSON {...}` line.
pub(crate) const DONE_LUA: &str = r#"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\"requests\":%d,\"bytes\":%d,\"duration_us\":%d,\"err_connect\":%d,\"err_read\":%d," ..
    "\"err_write\":%d,\"err_status\":%d,\"err_timeout\":%d,\"p50_us\":%d,\"p90_us\":%d,\"p99_us\":%d," ..
    "\"mean_us\":%f,\"max_us\":%d}\n",
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"#;

/// Runs `wrk` against `origin`'s `path`, through `proxy` when given.
pub fn run_wrk(
    dir: &Path,
    origin: SocketAddr,
    proxy: Option<SocketAddr>,
    path: &str,
    threads: u32,
    connections: u32,
    seconds: u64,
) -> Result<HttpFigures> {
    let mut script = String::new();
    if proxy.is_some() {
        script.push_str(&format!(
            "wrk.path = \"http://{origin}{path}\"\nwrk.headers[\"Host\"] = \"{origin}\"\n"
        ));
    }
    script.push_str(DONE_LUA);
    let name = format!(
        "wrk-{}-{}.lua",
        proxy.map(|p| p.port()).unwrap_or(0),
        path.trim_start_matches('/')
    );
    let script_path = dir.join(name);
    fs::write(&script_path, script)?;
    let target = proxy.unwrap_or(origin);
    let url = format!("http://{target}{path}");
    let out = Command::new("wrk")
        .arg(format!("-t{threads}"))
        .arg(format!("-c{}", connections.max(threads)))
        .arg(format!("-d{seconds}s"))
        .args(["--latency", "--timeout", "10s", "-s"])
        .arg(&script_path)
        .arg(&url)
        .output()
        .context("run wrk")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    parse(&stdout).with_context(|| {
        format!(
            "wrk ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// Figures from the `WRKJSON` line our Lua `done` hook prints.
fn parse(stdout: &str) -> Result<HttpFigures> {
    parse_summary(stdout, None)
}

/// Like [`parse`]; with `body_len` the bytes are the requests' uploads (`requests × body_len`)
/// instead of the responses.
pub(crate) fn parse_summary(stdout: &str, body_len: Option<u64>) -> Result<HttpFigures> {
    let json = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WRKJSON "))
        .context("wrk printed no summary")?;
    let r: Raw = serde_json::from_str(json).context("parse wrk summary")?;
    let secs = (r.duration_us / 1e6).max(1e-9);
    let bytes = match body_len {
        Some(len) => r.requests * len,
        None => r.bytes,
    };
    Ok(HttpFigures {
        requests: r.requests,
        bytes,
        duration_s: secs,
        requests_per_sec: r.requests as f64 / secs,
        transfer_mib_per_sec: bytes as f64 / secs / (1024.0 * 1024.0),
        p50_ms: r.p50_us / 1e3,
        p90_ms: r.p90_us / 1e3,
        p99_ms: r.p99_us / 1e3,
        mean_ms: r.mean_us / 1e3,
        max_ms: r.max_us / 1e3,
        errors_connect: r.err_connect,
        errors_read: r.err_read,
        errors_write: r.err_write,
        errors_timeout: r.err_timeout,
        non_2xx: r.err_status,
        bytes_per_response: if r.requests == 0 {
            0.0
        } else {
            bytes as f64 / r.requests as f64
        },
        cpu: None,
    })
}

/// Fetches `path` from `origin` (through `proxy` if given) and checks status 200 and the exact body.
pub fn verify_fetch(
    origin: SocketAddr,
    proxy: Option<SocketAddr>,
    path: &str,
    expected: &[u8],
) -> Result<()> {
    let target = proxy.unwrap_or(origin);
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let line = match proxy {
        Some(_) => format!("http://{origin}{path}"),
        None => path.to_string(),
    };
    write!(
        s,
        "GET {line} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of response head")?;
    let head = String::from_utf8_lossy(&resp[..split]);
    let status = head.lines().next().unwrap_or_default();
    if !(status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200")) {
        bail!("GET {line}: status line {status:?}");
    }
    let body = &resp[split + 4..];
    if body != expected {
        bail!(
            "GET {line}: body of {} bytes differs from the {}-byte file",
            body.len(),
            expected.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_lua_summary_line() {
        let out = "Running 1s test\nWRKJSON {\"requests\":2000,\"bytes\":2560000,\"duration_us\":2000000,\
                   \"err_connect\":0,\"err_read\":3,\"err_write\":0,\"err_status\":1,\"err_timeout\":0,\
                   \"p50_us\":1500,\"p90_us\":2500,\"p99_us\":9000,\"mean_us\":1700.5,\"max_us\":12000}\n";
        let f = parse(out).expect("parse");
        assert_eq!(f.requests, 2000);
        assert!((f.requests_per_sec - 1000.0).abs() < 1e-9);
        assert!((f.p99_ms - 9.0).abs() < 1e-9);
        assert_eq!(f.non_2xx, 1);
        assert_eq!(f.socket_errors(), 3);
        assert!((f.bytes_per_response - 1280.0).abs() < 1e-9);
    }

    #[test]
    fn missing_summary_is_an_error() {
        assert!(parse("unable to connect to 127.0.0.1:1\n").is_err());
    }
}
