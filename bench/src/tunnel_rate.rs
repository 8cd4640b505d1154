//! The new-tunnel load generator: each iteration opens one tunnel (HTTP `CONNECT` or SOCKS5, or
//! straight to the origin for the ceiling), sends one `GET` for a 1 KiB file with
//! `Connection: close`, reads the response to EOF, checks it and closes; a fixed number of
//! iterations are in flight at any time.
//!
//! Built so the generator is not what limits the figure: one OS thread per core, each with its
//! own current-thread tokio runtime (no work stealing, no cross-thread wakeups), the handshake
//! and request bytes built once before the run, one reused response buffer per in-flight slot,
//! and counts kept in per-thread locals until the end. Its own ceiling — the same loop straight
//! to the origin — is measured in the same run and reported beside the proxies' figures.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::load::Via;

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct TunnelRate {
    pub in_flight: u32,
    pub threads: u32,
    pub seconds: f64,
    pub completed: u64,
    pub errors: u64,
    pub tunnels_per_sec: f64,
    /// Median and 99th percentile of one iteration (connect to EOF), from a log-scale histogram.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub first_error: Option<String>,
}

/// The bytes of one iteration, built once per run.
struct Script {
    via: Via,
    /// CONNECT request or SOCKS5 CONNECT request (empty when direct).
    open: Vec<u8>,
    get: Vec<u8>,
    body_len: usize,
}

impl Script {
    fn new(via: Via, origin: SocketAddr, path: &str, body_len: usize) -> Result<Self> {
        let open = match via {
            Via::Direct => Vec::new(),
            Via::Connect(_) => {
                format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n").into_bytes()
            }
            Via::Socks5(_) => {
                let SocketAddr::V4(t) = origin else {
                    bail!("the SOCKS5 script takes an IPv4 origin");
                };
                let mut r = vec![5, 1, 0, 1];
                r.extend_from_slice(&t.ip().octets());
                r.extend_from_slice(&t.port().to_be_bytes());
                r
            }
        };
        let get = format!(
            "GET {path} HTTP/1.1\r\nHost: {origin}\r\nUser-Agent: switchyard-bench\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        Ok(Script {
            via,
            open,
            get,
            body_len,
        })
    }

    fn dial_addr(&self, origin: SocketAddr) -> SocketAddr {
        match self.via {
            Via::Direct => origin,
            Via::Connect(p) | Via::Socks5(p) => p,
        }
    }
}

/// Iteration times in 5 %-wide buckets from 10 µs up (log scale): p50/p99 without storing
/// samples.
#[derive(Clone)]
struct Histogram {
    buckets: Vec<u64>,
}

const HIST_BASE_US: f64 = 10.0;
const HIST_STEP: f64 = 1.05;
const HIST_BUCKETS: usize = 300; // 10 µs · 1.05^300 ≈ 22 min: anything real fits

impl Histogram {
    fn new() -> Self {
        Histogram {
            buckets: vec![0; HIST_BUCKETS],
        }
    }

    fn record(&mut self, d: Duration) {
        let us = d.as_secs_f64() * 1e6;
        let i = if us <= HIST_BASE_US {
            0
        } else {
            ((us / HIST_BASE_US).ln() / HIST_STEP.ln()).ceil() as usize
        };
        self.buckets[i.min(HIST_BUCKETS - 1)] += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }

    /// Upper edge of the bucket holding quantile `q`, in milliseconds.
    fn quantile_ms(&self, q: f64) -> f64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return HIST_BASE_US * HIST_STEP.powi(i as i32) / 1000.0;
            }
        }
        HIST_BASE_US * HIST_STEP.powi(HIST_BUCKETS as i32) / 1000.0
    }
}

/// One task's or thread's tally.
struct Tally {
    completed: u64,
    errors: u64,
    first_error: Option<String>,
    hist: Histogram,
}

impl Tally {
    fn new() -> Self {
        Tally {
            completed: 0,
            errors: 0,
            first_error: None,
            hist: Histogram::new(),
        }
    }

    fn add(&mut self, other: Tally) {
        self.completed += other.completed;
        self.errors += other.errors;
        self.hist.merge(&other.hist);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Runs `in_flight` iterations at a time for `seconds` over `threads` threads.
pub fn run(
    via: Via,
    origin: SocketAddr,
    path: &str,
    body_len: usize,
    in_flight: u32,
    threads: u32,
    seconds: u64,
) -> Result<TunnelRate> {
    ensure!(
        in_flight > 0 && threads > 0,
        "in_flight and threads must be > 0"
    );
    let threads = threads.min(in_flight);
    let script = std::sync::Arc::new(Script::new(via, origin, path, body_len)?);
    let t0 = Instant::now();
    let stop = t0 + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    for t in 0..threads {
        // Spread the in-flight slots over the threads as evenly as they divide.
        let slots = in_flight / threads + u32::from(t < in_flight % threads);
        let script = script.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("tunnel-rate-{t}"))
                .spawn(move || -> Result<Tally> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    rt.block_on(thread_main(script, origin, slots, stop))
                })?,
        );
    }
    let mut total = Tally::new();
    for h in handles {
        total.add(
            h.join()
                .map_err(|_| anyhow::anyhow!("a load thread panicked"))??,
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(TunnelRate {
        in_flight,
        threads,
        seconds: secs,
        completed: total.completed,
        errors: total.errors,
        tunnels_per_sec: total.completed as f64 / secs,
        p50_ms: total.hist.quantile_ms(0.50),
        p99_ms: total.hist.quantile_ms(0.99),
        first_error: total.first_error,
    })
}

async fn thread_main(
    script: std::sync::Arc<Script>,
    origin: SocketAddr,
    slots: u32,
    stop: Instant,
) -> Result<Tally> {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let mut tasks = Vec::new();
            for _ in 0..slots {
                let script = script.clone();
                tasks.push(tokio::task::spawn_local(async move {
                    let mut tally = Tally::new();
                    let mut buf = vec![0u8; 4096];
                    while Instant::now() < stop {
                        let began = Instant::now();
                        let one = tokio::time::timeout(
                            Duration::from_secs(5),
                            iteration(&script, origin, &mut buf),
                        )
                        .await;
                        match one {
                            Ok(Ok(())) => {
                                tally.completed += 1;
                                tally.hist.record(began.elapsed());
                            }
                            Ok(Err(e)) => {
                                tally.errors += 1;
                                tally.first_error.get_or_insert_with(|| format!("{e:#}"));
                                // a refusing proxy must not turn the loop into a busy spin
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            Err(_) => {
                                tally.errors += 1;
                                tally
                                    .first_error
                                    .get_or_insert_with(|| "iteration timed out (5 s)".into());
                            }
                        }
                    }
                    tally
                }));
            }
            let mut total = Tally::new();
            for t in tasks {
                total.add(t.await.context("load task")?);
            }
            Ok(total)
        })
        .await
}

/// One tunnel: open, GET, read to EOF, check status and body length.
async fn iteration(script: &Script, origin: SocketAddr, buf: &mut [u8]) -> Result<()> {
    let mut s = TcpStream::connect(script.dial_addr(origin)).await?;
    s.set_nodelay(true)?;
    match script.via {
        Via::Direct => {}
        Via::Connect(_) => {
            s.write_all(&script.open).await?;
            // The origin says nothing before the GET, so the answer is exactly the head.
            let mut have = 0;
            loop {
                ensure!(have < buf.len(), "CONNECT answer too long");
                let n = s.read(&mut buf[have..]).await?;
                ensure!(n > 0, "proxy closed during CONNECT");
                have += n;
                if buf[..have].ends_with(b"\r\n\r\n") {
                    break;
                }
            }
            ensure!(
                buf[..have].starts_with(b"HTTP/1.1 200")
                    || buf[..have].starts_with(b"HTTP/1.0 200"),
                "CONNECT answered {:?}",
                String::from_utf8_lossy(&buf[..have.min(40)])
            );
        }
        Via::Socks5(_) => {
            s.write_all(&[5, 1, 0]).await?;
            s.read_exact(&mut buf[..2]).await?;
            ensure!(buf[..2] == [5, 0], "SOCKS5 method reply {:?}", &buf[..2]);
            s.write_all(&script.open).await?;
            // IPv4 bound address: 10 bytes (the only kind these proxies answer to an IPv4 request)
            s.read_exact(&mut buf[..4]).await?;
            ensure!(
                buf[0] == 5 && buf[1] == 0,
                "SOCKS5 CONNECT reply {:?}",
                &buf[..4]
            );
            let rest = match buf[3] {
                1 => 6,
                4 => 18,
                a => bail!("SOCKS5 reply address type {a}"),
            };
            s.read_exact(&mut buf[..rest]).await?;
        }
    }
    s.write_all(&script.get).await?;
    let mut have = 0;
    loop {
        ensure!(have < buf.len(), "response longer than {} bytes", buf.len());
        let n = s.read(&mut buf[have..]).await?;
        if n == 0 {
            break;
        }
        have += n;
    }
    let resp = &buf[..have];
    ensure!(
        resp.starts_with(b"HTTP/1.1 200"),
        "origin answered {:?}",
        String::from_utf8_lossy(&resp[..have.min(40)])
    );
    let head = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("response without a complete head")?;
    let body = have - head - 4;
    ensure!(
        body == script.body_len,
        "body of {body} bytes, expected {}",
        script.body_len
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_land_in_the_right_bucket() {
        let mut h = Histogram::new();
        for _ in 0..98 {
            h.record(Duration::from_micros(500));
        }
        h.record(Duration::from_millis(20));
        h.record(Duration::from_millis(20));
        let p50 = h.quantile_ms(0.5);
        assert!((0.5..0.53).contains(&p50), "{p50}");
        let p99 = h.quantile_ms(0.99);
        assert!((20.0..21.1).contains(&p99), "{p99}");
        assert_eq!(Histogram::new().quantile_ms(0.99), 0.0);
    }

    /// A tiny HTTP origin on loopback: answers every connection with a 1 KiB body and closes.
    fn origin() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut req = [0u8; 1024];
                let mut have = 0;
                while !req[..have].ends_with(b"\r\n\r\n") {
                    match s.read(&mut req[have..]) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => have += n,
                    }
                }
                let mut out =
                    b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\nConnection: close\r\n\r\n"
                        .to_vec();
                out.extend_from_slice(&[7u8; 1024]);
                let _ = s.write_all(&out);
            }
        });
        addr
    }

    #[test]
    fn direct_iterations_complete_and_a_wrong_length_is_an_error() {
        let o = origin();
        let r = run(Via::Direct, o, "/1k.bin", 1024, 4, 2, 1).expect("run");
        assert!(r.completed > 0 && r.errors == 0, "{r:?}");
        assert!(r.p99_ms >= r.p50_ms && r.p50_ms > 0.0, "{r:?}");
        let r = run(Via::Direct, o, "/1k.bin", 1000, 2, 1, 1).expect("run");
        assert_eq!(r.completed, 0, "{r:?}");
        assert!(
            r.first_error
                .as_deref()
                .is_some_and(|e| e.contains("body of 1024 bytes")),
            "{r:?}"
        );
    }
}
