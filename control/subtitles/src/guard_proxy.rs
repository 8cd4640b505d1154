//! A small HTTP proxy on 127.0.0.1 that yt-dlp is told to use (`--proxy`), so the fetch guard
//! covers yt-dlp's own connections too: pages, redirects, manifests and media. `CONNECT
//! host:port` (https) and absolute-form requests (`GET http://host/path`) are accepted; the
//! host is resolved once with [`resolve_checked`] and the connection goes to a checked address.
//! A refused host gets `403` and yt-dlp fails with it. Plain-HTTP requests are forwarded with
//! `Connection: close` and the client connection ends with the response, so one proxy
//! connection never carries a second request to another host.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::fetch_guard::{resolve_checked, FetchPolicy, ResolveError};

const MAX_HEAD: usize = 64 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// The running proxy; stops when dropped.
pub struct GuardProxy {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GuardProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GuardProxy {
    /// Listens on 127.0.0.1 (any free port).
    pub async fn start(
        policy: Arc<FetchPolicy>,
        connect_timeout: Duration,
    ) -> std::io::Result<GuardProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let policy = policy.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(client, &policy, connect_timeout).await {
                        tracing::debug!("guard proxy: {e}");
                    }
                });
            }
        });
        Ok(GuardProxy { addr, task })
    }

    /// `http://127.0.0.1:PORT`, for `yt-dlp --proxy`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// `CONNECT host:port`.
    Connect { host: String, port: u16 },
    /// An absolute-form http request, rewritten to origin form with `Connection: close`.
    Forward {
        host: String,
        port: u16,
        head: Vec<u8>,
    },
}

/// Parses a proxy request head (without the final blank line). Runtime-free.
pub fn parse_head(head: &str) -> Result<Head, String> {
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed request line".into());
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() {
        return Err("malformed request line".into());
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let url = url::Url::parse(&format!("http://{target}/"))
            .map_err(|_| format!("bad CONNECT target {target:?}"))?;
        let (Some(host), Some(port)) = (url.host_str(), url.port()) else {
            return Err(format!("CONNECT needs host:port, got {target:?}"));
        };
        return Ok(Head::Connect {
            host: host.to_string(),
            port,
        });
    }
    let url = url::Url::parse(target).map_err(|_| format!("not an absolute URL: {target:?}"))?;
    if url.scheme() != "http" {
        return Err(format!("only http:// is forwarded, got {target:?}"));
    }
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return Err(format!("no host in {target:?}"));
    };
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines {
        let name = line.split(':').next().unwrap_or_default().trim();
        let hop_by_hop = [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h));
        if !hop_by_hop && !line.is_empty() {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Head::Forward {
        host: host.to_string(),
        port,
        head: out.into_bytes(),
    })
}

async fn reply(client: &mut TcpStream, status: &str, message: &str) -> std::io::Result<()> {
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{message}",
        message.len()
    );
    client.write_all(text.as_bytes()).await
}

async fn serve(
    mut client: TcpStream,
    policy: &FetchPolicy,
    connect_timeout: Duration,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = tokio::time::timeout(HEAD_TIMEOUT, async {
        loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok::<_, std::io::Error>(Some(i));
            }
            if buf.len() > MAX_HEAD {
                return Ok(None);
            }
            let mut chunk = [0u8; 4096];
            let n = client.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .map_err(|_| std::io::Error::other("no request head in time"))??;
    let Some(head_end) = head_end else {
        return Ok(());
    };
    let rest = buf.split_off(head_end + 4);
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let parsed = match parse_head(&head) {
        Ok(p) => p,
        Err(e) => return reply(&mut client, "400 Bad Request", &e).await,
    };
    let (host, port) = match &parsed {
        Head::Connect { host, port } | Head::Forward { host, port, .. } => (host.clone(), *port),
    };
    let ips = match resolve_checked(policy, &host).await {
        Ok(ips) => ips,
        Err(ResolveError::Refused(r)) => {
            tracing::info!(host, "yt-dlp fetch refused by the fetch guard");
            return reply(&mut client, "403 Forbidden", &r.to_string()).await;
        }
        Err(e) => return reply(&mut client, "502 Bad Gateway", &e.to_string()).await,
    };
    let mut upstream = None;
    for ip in ips {
        let addr = SocketAddr::new(ip, port);
        if let Ok(Ok(s)) = tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
            upstream = Some(s);
            break;
        }
    }
    let Some(mut upstream) = upstream else {
        return reply(&mut client, "502 Bad Gateway", "cannot connect").await;
    };
    match parsed {
        Head::Connect { .. } => {
            client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await?;
            upstream.write_all(&rest).await?;
            tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        }
        Head::Forward { head, .. } => {
            upstream.write_all(&head).await?;
            upstream.write_all(&rest).await?;
            let (mut cr, mut cw) = client.split();
            let (mut ur, mut uw) = upstream.split();
            // the exchange ends with the response: the client must reconnect (and be checked)
            // for its next request
            tokio::select! {
                r = tokio::io::copy(&mut ur, &mut cw) => { r?; }
                r = tokio::io::copy(&mut cr, &mut uw) => {
                    r?;
                    tokio::io::copy(&mut ur, &mut cw).await?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        assert_eq!(
            parse_head("CONNECT www.youtube.com:443 HTTP/1.1\r\nHost: www.youtube.com:443"),
            Ok(Head::Connect {
                host: "www.youtube.com".into(),
                port: 443
            })
        );
        assert_eq!(
            parse_head("CONNECT [::1]:8443 HTTP/1.1"),
            Ok(Head::Connect {
                host: "[::1]".into(),
                port: 8443
            })
        );
        let Ok(Head::Forward { host, port, head }) = parse_head(
            "GET http://media.example:8080/a/b.mp4?x=1 HTTP/1.1\r\nHost: media.example:8080\r\n\
             Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\nRange: bytes=0-",
        ) else {
            panic!("forward")
        };
        assert_eq!((host.as_str(), port), ("media.example", 8080));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /a/b.mp4?x=1 HTTP/1.1\r\nHost: media.example:8080\r\nRange: bytes=0-\r\nConnection: close\r\n\r\n"
        );
        for bad in [
            "",
            "GET /relative HTTP/1.1",
            "GET https://x/ HTTP/1.1",
            "CONNECT nohost HTTP/1.1",
            "GET http://x/ SPDY/3",
            "GET  http://x/ HTTP/1.1",
        ] {
            assert!(parse_head(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn refuses_internal_hosts_and_forwards_allowed_ones() {
        // an origin on loopback
        let origin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin_port = origin.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = origin.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let first = req.lines().next().unwrap_or_default().to_string();
                let body = format!("saw {first}");
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        let ask = |proxy: String, target: String| async move {
            let mut s = TcpStream::connect(proxy.trim_start_matches("http://"))
                .await
                .unwrap();
            s.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let target = format!("http://127.0.0.1:{origin_port}/v.mp4?a=1");

        let strict = GuardProxy::start(Arc::new(FetchPolicy::default()), Duration::from_secs(5))
            .await
            .unwrap();
        let out = ask(strict.url(), target.clone()).await;
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
        assert!(out.contains("internal address"), "{out}");

        let cfg = switchyard_config::subtitles::SubtitlesFetch {
            allow_private: false,
            allow: vec!["127.0.0.1".into()],
        };
        let open = GuardProxy::start(
            Arc::new(FetchPolicy::from_config(&cfg)),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let out = ask(open.url(), target).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.ends_with("saw GET /v.mp4?a=1 HTTP/1.1"), "{out}");
    }
}
