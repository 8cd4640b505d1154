//! Scenario `quic`: the client → server leg over QUIC against CONNECT over TCP. One
//! `switchyard server` with `server.quic.listen` (and its HTTP proxy for the CONNECT leg), one
//! `switchyard client` per row whose only server entry is either `protocol: QUIC` (the server's
//! certificate fingerprint from `GET /api/v1/quic` pinned, a token) or `protocol: HTTP`, nginx
//! as origin. Per row: new flows one after another (CONNECT through the client's HTTP proxy,
//! `GET /1k.bin`, read to EOF; p50/p99) and one 32 MiB download through a CONNECT tunnel of the
//! client, at 0 ms and 50 ms RTT, and for QUIC at 1 % loss.
//!
//! This kernel has no `sch_netem`, so delay and loss come from user-space Python relays
//! (`bench/relays/`) put between client and server: a UDP relay delaying and dropping datagrams
//! for QUIC, a TCP relay delaying chunks for CONNECT. TCP cannot lose packets in a user-space
//! relay, so there is no CONNECT row with loss.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::json;

use crate::peers;
use crate::procs::{self, Procs};
use crate::report::{f, table};
use crate::scenarios::{loadavg, Ctx};

const UDP_IMPAIR: &str = include_str!("../relays/udp_impair.py");
const TCP_DELAY: &str = include_str!("../relays/tcp_delay.py");

const SMALL: usize = 1024;
const BIG: usize = 32 << 20;
/// The QUIC server's token; the client presents it.
const TOKEN: &str = "switchyard-bench";
/// New flows per row at most (fewer when `--seconds` runs out first, never fewer than this).
const MAX_FLOWS: usize = 200;
const MIN_FLOWS: usize = 20;
/// A download still running after this is stopped and its rate counted from what arrived (at
/// 1 % loss and 50 ms a loss-based controller manages ~0.3 MB/s: 32 MiB would take minutes).
const DOWNLOAD_CAP: Duration = Duration::from_secs(30);
const IO_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Leg {
    Quic,
    ConnectTcp,
}

impl Leg {
    fn label(self) -> &'static str {
        match self {
            Leg::Quic => "QUIC",
            Leg::ConnectTcp => "CONNECT/TCP",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Flows {
    count: usize,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Download {
    bytes: usize,
    seconds: f64,
    mb_per_s: f64,
    /// false when [`DOWNLOAD_CAP`] stopped it before the end.
    complete: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    leg: Leg,
    rtt_ms: u32,
    loss_percent: f64,
    new_flows: Option<Flows>,
    download: Option<Download>,
    error: Option<String>,
    load_before: String,
    load_after: String,
}

pub fn run(ctx: &Ctx) -> Result<String> {
    let python = procs::which("python3").context("python3 is not installed (the RTT relays)")?;
    let mut origin_procs = Procs::default();
    let www = ctx.env.dir.join("www-quic");
    fs::create_dir_all(&www)?;
    fs::write(www.join("1k.bin"), vec![7u8; SMALL])?;
    fs::write(www.join("big.bin"), pattern(BIG))?;
    let nginx = peers::nginx(&mut origin_procs, &ctx.env, &www).context("origin nginx")?;
    let mut server_procs = Procs::default();
    let server = peers::switchyard_quic(&mut server_procs, &ctx.env, &ctx.switchyard, TOKEN)
        .context("switchyard server with QUIC")?;

    let mut rows = Vec::new();
    for (rtt_ms, loss) in [(0u32, 0.0f64), (50, 0.0), (50, 0.01)] {
        for leg in [Leg::Quic, Leg::ConnectTcp] {
            if leg == Leg::ConnectTcp && loss > 0.0 {
                continue;
            }
            tracing::info!(
                "quic: {} at {rtt_ms} ms, {} % loss",
                leg.label(),
                loss * 100.0
            );
            procs::settle(Duration::from_secs(10));
            let load_before = loadavg();
            let mut row = Row {
                leg,
                rtt_ms,
                loss_percent: loss * 100.0,
                new_flows: None,
                download: None,
                error: None,
                load_before,
                load_after: String::new(),
            };
            if let Err(e) = measure_row(ctx, &python, &server, nginx.addr, &mut row) {
                row.error = Some(format!("{e:#}"));
            }
            row.load_after = loadavg();
            rows.push(row);
        }
    }
    // The server's own account: every QUIC row must have been a QUIC connection (no fallback).
    let quic_status = peers::api_get(server.api, "/api/v1/quic")
        .unwrap_or_else(|e| json!({ "error": format!("{e:#}") }));
    drop(server_procs);
    drop(origin_procs);

    ctx.write_json(
        "quic",
        json!({
            "params": {
                "new_flow": "CONNECT through the client's HTTP proxy + GET 1 KiB + read to EOF, one after another",
                "max_flows": MAX_FLOWS, "min_flows": MIN_FLOWS, "seconds": ctx.seconds,
                "download_bytes": BIG, "download_cap_s": DOWNLOAD_CAP.as_secs(),
                "impairment": "user-space Python relays (bench/relays/): UDP delay+loss for QUIC, TCP delay for CONNECT",
            },
            "switchyard": server.started.version,
            "origin": nginx.version,
            "server_quic_status": quic_status,
            "rows": rows,
        }),
    )?;
    let mut md = summary(ctx, &rows);
    let _ = writeln!(
        md,
        "\nThe server's `GET /api/v1/quic` after the run: `connections_total` {}.",
        quic_status["connections_total"]
    );
    Ok(md)
}

/// Starts the row's relay (if impaired) and client, then measures flows and the download.
fn measure_row(
    ctx: &Ctx,
    python: &Path,
    server: &peers::QuicServer,
    origin: SocketAddr,
    row: &mut Row,
) -> Result<()> {
    let mut procs = Procs::default();
    let impaired = row.rtt_ms > 0 || row.loss_percent > 0.0;
    let one_way = (row.rtt_ms / 2).to_string();
    let (name, entry) = match row.leg {
        Leg::Quic => {
            let addr = if impaired {
                let up = server.quic;
                let args = [
                    up.ip().to_string(),
                    up.port().to_string(),
                    one_way,
                    (row.loss_percent / 100.0).to_string(),
                ];
                relay(
                    &mut procs,
                    ctx,
                    python,
                    &row_name("udp-relay", row),
                    UDP_IMPAIR,
                    &args,
                )?
            } else {
                server.quic
            };
            (
                row_name("client-quic", row),
                format!(
                    "address: \"{addr}\", protocol: QUIC, fingerprint: \"{}\", token: \"{TOKEN}\"",
                    server.fingerprint
                ),
            )
        }
        Leg::ConnectTcp => {
            let addr = if impaired {
                let up = server.started.addr;
                let args = [up.ip().to_string(), up.port().to_string(), one_way];
                relay(
                    &mut procs,
                    ctx,
                    python,
                    &row_name("tcp-relay", row),
                    TCP_DELAY,
                    &args,
                )?
            } else {
                server.started.addr
            };
            (
                row_name("client-tcp", row),
                format!("address: \"{addr}\", protocol: HTTP"),
            )
        }
    };
    let client =
        peers::switchyard_client_with(&mut procs, &ctx.env, &ctx.switchyard, &name, &entry)
            .context("switchyard client")?;
    // Warm-up: the client's leg to the server is up and the origin has been reached once.
    for _ in 0..2 {
        new_flow(client.addr, origin).context("warm-up flow")?;
    }
    let deadline = Instant::now() + Duration::from_secs(ctx.seconds);
    let mut times = Vec::new();
    while times.len() < MAX_FLOWS && (times.len() < MIN_FLOWS || Instant::now() < deadline) {
        times.push(new_flow(client.addr, origin).context("new flow")?);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    row.new_flows = Some(Flows {
        count: times.len(),
        p50_ms: percentile(&times, 0.50),
        p99_ms: percentile(&times, 0.99),
    });
    row.download = Some(download(client.addr, origin).context("download")?);
    Ok(())
}

/// `what` of this row, as a unique file or directory name.
fn row_name(what: &str, row: &Row) -> String {
    format!("{what}-{}ms-{}pct", row.rtt_ms, row.loss_percent)
}

/// Starts a relay script with `args` and returns the loopback address it printed.
fn relay(
    procs: &mut Procs,
    ctx: &Ctx,
    python: &Path,
    name: &str,
    script: &str,
    args: &[String],
) -> Result<SocketAddr> {
    let log = ctx
        .env
        .dir
        .join(format!("{name}-{}.log", procs::free_port()?));
    let mut cmd = Command::new(python);
    cmd.arg("-u").arg("-c").arg(script).args(args);
    let pid = procs.spawn(name, cmd, &log)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let printed = fs::read_to_string(&log).unwrap_or_default();
        if let Some(port) = printed
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u16>().ok())
        {
            return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
        }
        if let Some(reason) = procs.exited(pid) {
            bail!("{name}: {reason}; log: {}", procs::tail(&log, 5));
        }
        if Instant::now() > deadline {
            bail!(
                "{name} printed no port in 10 s; log: {}",
                procs::tail(&log, 5)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A CONNECT tunnel through `proxy` to `origin`, its `200` answer read.
fn open_tunnel(proxy: SocketAddr, origin: SocketAddr) -> Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&proxy, IO_TIMEOUT)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    write!(s, "CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n")?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 || head.len() > 8192 {
            bail!(
                "CONNECT: no complete answer: {}",
                String::from_utf8_lossy(&head)
            );
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
        bail!("CONNECT refused: {}", String::from_utf8_lossy(&head).trim());
    }
    Ok(s)
}

/// Milliseconds of one new flow: tunnel, `GET /1k.bin`, read to EOF, body checked.
fn new_flow(proxy: SocketAddr, origin: SocketAddr) -> Result<f64> {
    let started = Instant::now();
    let mut t = open_tunnel(proxy, origin)?;
    t.write_all(b"GET /1k.bin HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::with_capacity(2048);
    t.read_to_end(&mut answer)?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let body = body_len(&answer)?;
    if body != SMALL {
        bail!("GET /1k.bin: {body} body bytes, expected {SMALL}");
    }
    Ok(ms)
}

/// One download of `/big.bin` through a tunnel, stopped after [`DOWNLOAD_CAP`].
fn download(proxy: SocketAddr, origin: SocketAddr) -> Result<Download> {
    let started = Instant::now();
    let mut t = open_tunnel(proxy, origin)?;
    t.write_all(b"GET /big.bin HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n")?;
    let mut buf = vec![0u8; 256 << 10];
    let mut head: Vec<u8> = Vec::new();
    let mut body = None::<usize>;
    let mut received = 0usize;
    loop {
        if started.elapsed() > DOWNLOAD_CAP {
            break;
        }
        let n = t.read(&mut buf)?;
        if n == 0 {
            break;
        }
        received += n;
        if body.is_none() {
            head.extend_from_slice(&buf[..n]);
            if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                if !head.starts_with(b"HTTP/1.1 200") {
                    bail!("GET /big.bin: {}", String::from_utf8_lossy(&head[..i]));
                }
                body = Some(i + 4);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let bytes = received.saturating_sub(body.unwrap_or(received));
    let complete = bytes == BIG;
    if bytes > BIG || (!complete && seconds <= DOWNLOAD_CAP.as_secs_f64()) {
        bail!("GET /big.bin: connection ended after {bytes} of {BIG} body bytes");
    }
    Ok(Download {
        bytes,
        seconds,
        mb_per_s: bytes as f64 / 1e6 / seconds,
        complete,
    })
}

/// Body length of a complete `200` response with `Connection: close`.
fn body_len(answer: &[u8]) -> Result<usize> {
    if !answer.starts_with(b"HTTP/1.1 200") {
        bail!(
            "not a 200 answer: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(80)])
        );
    }
    let i = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of the response head")?;
    Ok(answer.len() - i - 4)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Deterministic content of `len` bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn summary(ctx: &Ctx, rows: &[Row]) -> String {
    let mut md = format!(
        "## QUIC transport vs CONNECT over TCP (client → server leg)\n\n\
         `switchyard client` → `switchyard server` → nginx. New flow: CONNECT through the client's \
         HTTP proxy + `GET /1k.bin` + read to EOF, one after another ({MIN_FLOWS}–{MAX_FLOWS} per \
         row, {}s); download: one {} MiB file through a tunnel (stopped after {} s). RTT and \
         loss come from user-space Python relays (no `sch_netem` on this kernel); the UDP relay \
         handles every datagram in Python and caps the 50 ms QUIC rows' throughput; there is no \
         CONNECT row with loss (a TCP relay cannot lose packets).\n\n",
        ctx.seconds,
        BIG >> 20,
        DOWNLOAD_CAP.as_secs()
    );
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.leg.label().to_string(),
                format!("{} ms", r.rtt_ms),
                format!("{} %", r.loss_percent),
            ];
            match &r.new_flows {
                Some(fl) => c.extend([fl.count.to_string(), f(fl.p50_ms, 2), f(fl.p99_ms, 2)]),
                None => c.extend(std::iter::repeat_n("–".to_string(), 3)),
            }
            c.push(match &r.download {
                Some(d) if d.complete => f(d.mb_per_s, 1),
                Some(d) => format!("{} (stopped after {} MiB)", f(d.mb_per_s, 2), d.bytes >> 20),
                None => "–".into(),
            });
            c.push(format!("{} / {}", r.load_before, r.load_after));
            c.push(match &r.error {
                Some(e) => format!("FAILED: {}", e.replace(['\n', '|'], " ")),
                None => "ok".into(),
            });
            c
        })
        .collect();
    md.push_str(&table(
        &[
            "leg",
            "RTT",
            "loss",
            "flows",
            "new flow p50 ms",
            "p99 ms",
            "download MB/s",
            "load before / after",
            "status",
        ],
        &cells,
    ));
    let _ = writeln!(md, "\nQUIC / CONNECT over TCP at the same RTT, no loss:\n");
    let mut ratio_rows = Vec::new();
    for rtt in [0u32, 50] {
        let find = |leg| {
            rows.iter().find(|r| {
                r.leg == leg && r.rtt_ms == rtt && r.loss_percent == 0.0 && r.error.is_none()
            })
        };
        let (Some(q), Some(t)) = (find(Leg::Quic), find(Leg::ConnectTcp)) else {
            ratio_rows.push(vec![
                format!("{rtt} ms"),
                "–".into(),
                "–".into(),
                "–".into(),
            ]);
            continue;
        };
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
            _ => "–".into(),
        };
        let p50 = |r: &Row| r.new_flows.as_ref().map(|x| x.p50_ms);
        let p99 = |r: &Row| r.new_flows.as_ref().map(|x| x.p99_ms);
        let dl = |r: &Row| r.download.as_ref().map(|x| x.mb_per_s);
        ratio_rows.push(vec![
            format!("{rtt} ms"),
            ratio(p50(q), p50(t)),
            ratio(p99(q), p99(t)),
            ratio(dl(q), dl(t)),
        ]);
    }
    md.push_str(&table(
        &["RTT", "new flow p50", "new flow p99", "download"],
        &ratio_rows,
    ));
    md.push_str(
        "\nLatency ratios below 1 and throughput ratios above 1 favour QUIC. New flows cost two \
         round trips on both legs (stream header + answer, then the request); the CONNECT leg is \
         plain TCP without TLS to the server, which QUIC always has.\n",
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.50), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn body_length_of_a_closed_response() {
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc";
        assert_eq!(body_len(answer).ok(), Some(3));
        assert!(body_len(b"HTTP/1.1 502 Bad Gateway\r\n\r\nx").is_err());
        assert!(body_len(b"HTTP/1.1 200 OK\r\nno end").is_err());
    }
}
