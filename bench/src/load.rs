//! In-process tokio servers (sink, echo, connection holder) and clients that reach them directly,
//! through an HTTP CONNECT tunnel or through SOCKS5.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;

/// How a client reaches its target.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    Direct,
    /// HTTP proxy, `CONNECT host:port HTTP/1.1`.
    Connect(SocketAddr),
    /// SOCKS5 proxy, no authentication.
    Socks5(SocketAddr),
}

impl Via {
    /// From the examples' `--connect` / `--socks5` flags: CONNECT when given, else SOCKS5 when
    /// given, else direct.
    pub fn from_flags(connect: Option<SocketAddr>, socks5: Option<SocketAddr>) -> Self {
        match (connect, socks5) {
            (Some(p), _) => Via::Connect(p),
            (None, Some(p)) => Via::Socks5(p),
            (None, None) => Via::Direct,
        }
    }
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a stream to `target` via `via`; the stream carries the target's bytes when this returns.
pub async fn open(via: Via, target: SocketAddr) -> Result<TcpStream> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, open_inner(via, target))
        .await
        .context("handshake timed out")?
}

async fn open_inner(via: Via, target: SocketAddr) -> Result<TcpStream> {
    match via {
        Via::Direct => {
            let s = TcpStream::connect(target).await?;
            s.set_nodelay(true)?;
            Ok(s)
        }
        Via::Connect(proxy) => {
            let mut s = TcpStream::connect(proxy).await?;
            s.set_nodelay(true)?;
            s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
                .await?;
            // Read the response head byte-wise-safe: the target sends nothing before we do, so any
            // bytes after the blank line would be a protocol error anyway.
            let mut head = Vec::with_capacity(256);
            let mut buf = [0u8; 512];
            loop {
                let n = s.read(&mut buf).await?;
                ensure!(n > 0, "proxy closed during CONNECT");
                head.extend_from_slice(&buf[..n]);
                if head.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
                ensure!(head.len() < 16384, "CONNECT response head too long");
            }
            let status = String::from_utf8_lossy(&head);
            let first = status.lines().next().unwrap_or_default();
            let code = first.split_whitespace().nth(1).unwrap_or_default();
            ensure!(code == "200", "CONNECT answered {first:?}");
            Ok(s)
        }
        Via::Socks5(proxy) => {
            let mut s = TcpStream::connect(proxy).await?;
            s.set_nodelay(true)?;
            s.write_all(&[5, 1, 0]).await?;
            let mut m = [0u8; 2];
            s.read_exact(&mut m).await?;
            ensure!(m == [5, 0], "SOCKS5 method reply {m:?}");
            let SocketAddr::V4(t) = target else {
                bail!("IPv6 targets not used here")
            };
            let mut req = vec![5, 1, 0, 1];
            req.extend_from_slice(&t.ip().octets());
            req.extend_from_slice(&t.port().to_be_bytes());
            s.write_all(&req).await?;
            let mut rep = [0u8; 4];
            s.read_exact(&mut rep).await?;
            ensure!(rep[0] == 5 && rep[1] == 0, "SOCKS5 CONNECT reply {rep:?}");
            let rest = match rep[3] {
                1 => 4 + 2,
                4 => 16 + 2,
                3 => usize::from(s.read_u8().await?) + 2,
                a => bail!("SOCKS5 reply address type {a}"),
            };
            let mut skip = vec![0u8; rest];
            s.read_exact(&mut skip).await?;
            Ok(s)
        }
    }
}

/// A server that reads and discards everything; counts the bytes.
pub async fn sink_server() -> Result<(SocketAddr, Arc<AtomicU64>)> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, crate::procs::free_port()?)).await?;
    let addr = l.local_addr()?;
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let c = c.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    c.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    Ok((addr, count))
}

/// Size of the connection-rate round trip.
const PING: usize = 32;

/// A server that echoes one `PING`-byte message and then closes: the server end closes first, so
/// TIME_WAIT stays on the listening side and no ephemeral ports pile up during a rate run.
pub async fn ping_server() -> Result<SocketAddr> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, crate::procs::free_port()?)).await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; PING];
                if s.read_exact(&mut buf).await.is_ok() {
                    let _ = s.write_all(&buf).await;
                }
            });
        }
    });
    Ok(addr)
}

/// Bulk throughput result.
#[derive(Debug, Clone, Serialize)]
pub struct Bulk {
    pub streams: u32,
    pub seconds: f64,
    pub bytes: u64,
    pub gbit_per_sec: f64,
    /// CPU seconds (user + system) the proxy spent per GiB it relayed, warm-up included: a
    /// figure that moves less with the machine's load than the rate does.
    pub proxy_cpu_s_per_gib: Option<f64>,
    /// Softirq seconds of the whole machine per GiB (see [`crate::procs::softirq_seconds`]): the
    /// TCP receive processing of every loopback hop, which no process's CPU includes. Other
    /// programs' network traffic would count too (loopback benches of others on the box).
    pub softirq_s_per_gib: Option<f64>,
}

/// Pushes bytes through `streams` parallel streams for `seconds` (after a short warm-up) and
/// measures what the sink received.
pub async fn bulk(
    via: Via,
    sink: SocketAddr,
    count: Arc<AtomicU64>,
    streams: u32,
    seconds: u64,
) -> Result<Bulk> {
    let mut conns = Vec::new();
    for _ in 0..streams {
        conns.push(open(via, sink).await?);
    }
    let warmup = Duration::from_millis(500);
    let total = warmup + Duration::from_secs(seconds);
    let stop = Instant::now() + total;
    let mut tasks = JoinSet::new();
    for mut s in conns {
        tasks.spawn(async move {
            let buf = vec![0x5au8; 128 * 1024];
            while Instant::now() < stop {
                if let Err(e) = s.write_all(&buf).await {
                    return Err(anyhow::anyhow!("write: {e}"));
                }
            }
            Ok(())
        });
    }
    tokio::time::sleep(warmup).await;
    let (b0, t0) = (count.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (b1, t1) = (count.load(Ordering::Relaxed), Instant::now());
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let secs = (t1 - t0).as_secs_f64();
    let bytes = b1.saturating_sub(b0);
    Ok(Bulk {
        streams,
        seconds: secs,
        bytes,
        gbit_per_sec: bytes as f64 * 8.0 / secs / 1e9,
        proxy_cpu_s_per_gib: None,
        softirq_s_per_gib: None,
    })
}

/// Connection-rate result.
#[derive(Debug, Clone, Serialize)]
pub struct ConnRate {
    pub workers: u32,
    pub seconds: f64,
    pub completed: u64,
    pub errors: u64,
    pub per_sec: f64,
    pub first_error: Option<String>,
}

/// `workers` loops of: open via `via` to the ping server, one 32-byte round trip, wait for the
/// server's close.
pub async fn conn_rate(via: Via, echo: SocketAddr, workers: u32, seconds: u64) -> Result<ConnRate> {
    let stop = Instant::now() + Duration::from_secs(seconds);
    let t0 = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..workers {
        tasks.spawn(async move {
            let (mut ok, mut err, mut first) = (0u64, 0u64, None);
            while Instant::now() < stop {
                match tokio::time::timeout(Duration::from_secs(5), one_round_trip(via, echo)).await
                {
                    Ok(Ok(())) => ok += 1,
                    Ok(Err(e)) => {
                        err += 1;
                        first.get_or_insert_with(|| e.to_string());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(_) => {
                        err += 1;
                        first.get_or_insert_with(|| "round trip timed out".to_string());
                    }
                }
            }
            (ok, err, first)
        });
    }
    let (mut completed, mut errors, mut first_error) = (0, 0, None);
    while let Some(r) = tasks.join_next().await {
        let (ok, err, first) = r?;
        completed += ok;
        errors += err;
        if first_error.is_none() {
            first_error = first;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(ConnRate {
        workers,
        seconds: secs,
        completed,
        errors,
        per_sec: completed as f64 / secs,
        first_error,
    })
}

async fn one_round_trip(via: Via, echo: SocketAddr) -> Result<()> {
    let mut s = open(via, echo).await?;
    let msg: [u8; PING] = *b"switchyard-bench ping 0123456789";
    s.write_all(&msg).await?;
    let mut back = [0u8; PING];
    s.read_exact(&mut back).await?;
    ensure!(back == msg, "echo mismatch");
    // The server closes after the echo; the proxy must pass the close on.
    let n = s.read(&mut back).await?;
    ensure!(n == 0, "bytes after the echo");
    Ok(())
}

/// Listeners that complete TCP handshakes but never accept: the kernel holds the connections in
/// the accept queues, so holding thousands costs this process no file descriptors.
pub struct Holders {
    listeners: Vec<std::net::TcpListener>,
    pub addrs: Vec<SocketAddr>,
}

/// Enough non-accepting listeners (backlog `per`) to hold `n` connections.
pub fn holders(n: usize, per: u32) -> Result<Holders> {
    let mut listeners = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..n.div_ceil(per as usize).max(1) {
        let sock = TcpSocket::new_v4()?;
        sock.bind((Ipv4Addr::LOCALHOST, crate::procs::free_port()?).into())?;
        let l = sock.listen(per)?.into_std()?;
        addrs.push(l.local_addr()?);
        listeners.push(l);
    }
    Ok(Holders { listeners, addrs })
}

impl Holders {
    pub fn count(&self) -> usize {
        self.listeners.len()
    }
}

/// Opens `n` idle tunnels via `via` (spread over `targets`), at most `parallel` handshakes at a
/// time; returns the open streams and the number and first of the failures.
pub async fn open_idle(
    via: Via,
    targets: &[SocketAddr],
    n: usize,
    parallel: usize,
) -> (Vec<TcpStream>, u64, Option<String>) {
    let sem = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let target = targets[i % targets.len()];
        let sem = sem.clone();
        tasks.spawn(async move {
            let _permit = sem.acquire_owned().await;
            open(via, target).await
        });
    }
    let (mut open_streams, mut errors, mut first) = (Vec::with_capacity(n), 0, None);
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(s)) => open_streams.push(s),
            Ok(Err(e)) => {
                errors += 1;
                first.get_or_insert_with(|| format!("{e:#}"));
            }
            Err(e) => {
                errors += 1;
                first.get_or_insert_with(|| e.to_string());
            }
        }
    }
    (open_streams, errors, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn direct_echo_rate_and_bulk_work() {
        let echo = ping_server().await.expect("ping");
        let r = conn_rate(Via::Direct, echo, 4, 1).await.expect("rate");
        assert!(r.completed > 0 && r.errors == 0, "{r:?}");
        let (sink, count) = sink_server().await.expect("sink");
        let b = bulk(Via::Direct, sink, count, 1, 1).await.expect("bulk");
        assert!(b.bytes > 0, "{b:?}");
    }

    #[tokio::test]
    async fn holders_keep_connections_without_accepting() {
        let h = holders(100, 64).expect("holders");
        assert_eq!(h.count(), 2);
        let (streams, errors, first) = open_idle(Via::Direct, &h.addrs, 100, 16).await;
        assert_eq!((streams.len(), errors), (100, 0), "{first:?}");
    }
}
