//! Opening a TCP stream to a DNS server through the switchyard server's proxy: HTTP CONNECT
//! (Basic proxy authentication) or SOCKS5 (RFC 1928, username/password RFC 1929). The message
//! formats come from `switchyard-proto`; this module only does the tokio I/O around them.

use std::net::SocketAddr;

use base64::Engine as _;
use switchyard_proto::http1::{self, HeadLimits};
use switchyard_proto::socks5;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::UpstreamError;

/// Credentials for the proxy, both parts present.
pub struct Credentials<'a> {
    pub username: &'a str,
    pub password: &'a str,
}

fn refused(reason: impl Into<String>) -> UpstreamError {
    UpstreamError::Proxy(reason.into())
}

/// Sends `CONNECT target` on `stream` and reads the proxy's answer head. Bytes after the head
/// (none are expected: DNS servers do not speak first) are an error.
pub async fn http_connect(
    stream: &mut TcpStream,
    target: SocketAddr,
    credentials: Option<Credentials<'_>>,
) -> Result<(), UpstreamError> {
    let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(c) = credentials {
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", c.username, c.password));
        req.push_str(&format!("Proxy-Authorization: Basic {token}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await?;
    let limits = HeadLimits {
        max_head_bytes: 16 * 1024,
        max_headers: 64,
    };
    let mut buf = Vec::with_capacity(512);
    loop {
        match http1::parse_response_head(&buf, &limits) {
            Ok(Some((head, used))) => {
                if !(200..300).contains(&head.status) {
                    return Err(refused(format!(
                        "CONNECT {target} answered {} {}",
                        head.status, head.reason
                    )));
                }
                if used != buf.len() {
                    return Err(refused("bytes after the CONNECT answer"));
                }
                return Ok(());
            }
            Ok(None) => {}
            Err(e) => return Err(refused(format!("bad CONNECT answer: {e}"))),
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(refused("proxy closed during CONNECT"));
        }
    }
}

/// Reads from `stream` into `buf` until `parse` finds a complete message; drains it.
async fn read_message<T>(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, socks5::Socks5Error>,
) -> Result<T, UpstreamError> {
    loop {
        match parse(buf) {
            Ok(Some((value, used))) => {
                buf.drain(..used);
                return Ok(value);
            }
            Ok(None) => {}
            Err(e) => return Err(refused(format!("bad SOCKS5 answer: {e}"))),
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(refused("proxy closed during the SOCKS5 handshake"));
        }
    }
}

/// SOCKS5 CONNECT to `target` on `stream`.
pub async fn socks5_connect(
    stream: &mut TcpStream,
    target: SocketAddr,
    credentials: Option<Credentials<'_>>,
) -> Result<(), UpstreamError> {
    let mut out = Vec::with_capacity(64);
    let methods: &[u8] = match credentials {
        Some(_) => &[socks5::Method::NO_AUTH, socks5::Method::USER_PASS],
        None => &[socks5::Method::NO_AUTH],
    };
    socks5::encode_greeting(methods, &mut out);
    stream.write_all(&out).await?;
    let mut buf = Vec::new();
    let method = read_message(stream, &mut buf, socks5::parse_method_selection).await?;
    match (method, credentials) {
        (socks5::Method::NO_AUTH, _) => {}
        (socks5::Method::USER_PASS, Some(c)) => {
            out.clear();
            socks5::encode_userpass(c.username, c.password, &mut out)
                .map_err(|e| refused(e.to_string()))?;
            stream.write_all(&out).await?;
            if !read_message(stream, &mut buf, socks5::parse_userpass_status).await? {
                return Err(refused("SOCKS5 credentials rejected"));
            }
        }
        (m, _) => return Err(refused(format!("no acceptable SOCKS5 method ({m:#x})"))),
    }
    out.clear();
    socks5::encode_request(
        socks5::Command::Connect,
        &socks5::TargetAddr::Ip(target),
        &mut out,
    )
    .map_err(|e| refused(e.to_string()))?;
    stream.write_all(&out).await?;
    let (code, _bound) = read_message(stream, &mut buf, socks5::parse_reply).await?;
    if code != 0 {
        return Err(refused(format!(
            "SOCKS5 CONNECT {target} failed with reply {code}"
        )));
    }
    if !buf.is_empty() {
        return Err(refused("bytes after the SOCKS5 reply"));
    }
    Ok(())
}
