//! Opening a TCP stream to `host:port` through a backend: `direct` (resolve, then race the
//! addresses RFC 8305 style), an upstream HTTP proxy (CONNECT), an upstream SOCKS5 proxy, or a
//! TCP flow inside a user-space WireGuard tunnel ([`crate::wireguard`]), or a socket bound to an
//! OpenVPN tunnel's device ([`crate::openvpn`]).
//! The result is a plain byte stream to the destination, so HTTP, CONNECT and SOCKS5 clients
//! all use the same connectors. Plain-HTTP requests routed to an upstream HTTP proxy are the
//! exception: they go to the proxy itself in absolute form ([`Dialer::connect_for_request`]),
//! as a stock squid allows CONNECT only to TLS ports.

use crate::backend_stream::BackendStream;
use crate::error::DataplaneError;
use crate::offload::Offload;
use crate::resolver::Resolver;
use crate::snapshot::BackendKind;
use futures::stream::{FuturesUnordered, StreamExt};
use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use switchyard_proto::http1::{self, HeadLimits};
use switchyard_proto::socks5;

/// Delay before racing the next address (RFC 8305 "Connection Attempt Delay").
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// A connected stream plus bytes the upstream proxy sent after its handshake reply.
pub struct Connected {
    pub stream: BackendStream,
    pub early_data: Vec<u8>,
}

pub struct Dialer<'a> {
    pub resolver: &'a Resolver,
    pub offload: &'a Offload,
    pub timeout: Duration,
}

impl Dialer<'_> {
    pub async fn connect(
        &self,
        backend: &BackendKind,
        host: &str,
        port: u16,
    ) -> Result<Connected, DataplaneError> {
        let deadline = Instant::now() + self.timeout;
        match backend {
            BackendKind::Direct => Ok(Connected {
                stream: BackendStream::Tcp(self.connect_host(host, port, deadline).await?),
                early_data: Vec::new(),
            }),
            BackendKind::HttpProxy {
                host: proxy_host,
                port: proxy_port,
                authorization,
            } => {
                let stream = self.connect_host(proxy_host, *proxy_port, deadline).await?;
                let proxy = format!("{proxy_host}:{proxy_port}");
                within(
                    deadline,
                    &proxy,
                    http_connect(stream, &proxy, host, port, authorization.as_deref()),
                )
                .await
            }
            BackendKind::Socks5 {
                host: proxy_host,
                port: proxy_port,
                credentials,
            } => {
                let stream = self.connect_host(proxy_host, *proxy_port, deadline).await?;
                let proxy = format!("{proxy_host}:{proxy_port}");
                within(
                    deadline,
                    &proxy,
                    socks5_connect(stream, &proxy, host, port, credentials.as_ref()),
                )
                .await
            }
            BackendKind::Wireguard(tunnel) => Ok(Connected {
                stream: BackendStream::Wireguard(tunnel.0.open(self, host, port, deadline).await?),
                early_data: Vec::new(),
            }),
            BackendKind::Quic(server) => server.0.open(self, host, port, deadline).await,
            BackendKind::Openvpn(link) => Ok(Connected {
                stream: BackendStream::Tcp(link.0.open(self, host, port, deadline).await?),
                early_data: Vec::new(),
            }),
            BackendKind::Blocked { reason } => Err(DataplaneError::Blocked(reason)),
            BackendKind::Unavailable { type_name } => {
                Err(DataplaneError::BackendUnavailable((*type_name).into()))
            }
        }
    }

    /// The connection an absolute-form HTTP request for `host:port` is written to: the upstream
    /// HTTP proxy itself for an `httpproxy` backend (no CONNECT), otherwise [`Self::connect`].
    pub async fn connect_for_request(
        &self,
        backend: &BackendKind,
        host: &str,
        port: u16,
    ) -> Result<Connected, DataplaneError> {
        match backend.http_upstream() {
            Some((proxy_host, proxy_port, _)) => {
                let deadline = Instant::now() + self.timeout;
                Ok(Connected {
                    stream: BackendStream::Tcp(
                        self.connect_host(proxy_host, proxy_port, deadline).await?,
                    ),
                    early_data: Vec::new(),
                })
            }
            None => self.connect(backend, host, port).await,
        }
    }

    async fn connect_host(
        &self,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<TcpStream, DataplaneError> {
        let addrs = self.resolver.resolve(self.offload, host, port).await?;
        race_connect(&addrs, deadline, &HostPort { host, port }).await
    }
}

async fn within<T>(
    deadline: Instant,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, DataplaneError>>,
) -> Result<T, DataplaneError> {
    let left = deadline.saturating_duration_since(Instant::now());
    futures_lite::future::or(fut, async {
        glommio::timer::sleep(left).await;
        Err(DataplaneError::ConnectTimeout {
            target: what.to_owned(),
        })
    })
    .await
}

/// `host:port` as error messages name a connect target, formatted only when one is made (a
/// connect that succeeds allocates no label).
struct HostPort<'a> {
    host: &'a str,
    port: u16,
}

impl std::fmt::Display for HostPort<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

fn classify(target: &dyn std::fmt::Display, e: io::Error) -> DataplaneError {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => DataplaneError::Refused {
            target: target.to_string(),
        },
        io::ErrorKind::TimedOut => DataplaneError::ConnectTimeout {
            target: target.to_string(),
        },
        _ => DataplaneError::Connect {
            target: target.to_string(),
            source: e,
        },
    }
}

async fn attempt(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    TcpStream::connect_timeout(addr, timeout)
        .await
        .map_err(io::Error::from)
}

/// Races connection attempts: the next address starts when the previous one fails or after
/// [`ATTEMPT_DELAY`]; the first success wins and the others are cancelled.
pub async fn race_connect(
    addrs: &[SocketAddr],
    deadline: Instant,
    target: &dyn std::fmt::Display,
) -> Result<TcpStream, DataplaneError> {
    // One address (an IP literal, or a name with one record): nothing to race.
    if let [addr] = addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DataplaneError::ConnectTimeout {
                target: target.to_string(),
            });
        }
        let stream = attempt(*addr, left)
            .await
            .map_err(|e| classify(target, e))?;
        let _ = stream.set_nodelay(true);
        return Ok(stream);
    }
    let mut attempts = FuturesUnordered::new();
    let mut next = 0;
    let mut last_error = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DataplaneError::ConnectTimeout {
                target: target.to_string(),
            });
        }
        if attempts.is_empty() {
            let Some(&addr) = addrs.get(next) else {
                return Err(last_error.unwrap_or_else(|| DataplaneError::Resolve {
                    host: target.to_string(),
                    reason: "no addresses".into(),
                }));
            };
            next += 1;
            attempts.push(attempt(addr, left));
            continue;
        }
        let more = next < addrs.len();
        let wait = if more { ATTEMPT_DELAY.min(left) } else { left };
        let outcome = futures_lite::future::or(async { attempts.next().await.map(Some) }, async {
            glommio::timer::sleep(wait).await;
            Some(None)
        })
        .await;
        match outcome {
            Some(Some(Ok(stream))) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Some(Some(Err(e))) => {
                last_error = Some(classify(target, e));
                if attempts.is_empty() && !more {
                    return Err(
                        last_error.unwrap_or_else(|| DataplaneError::ConnectTimeout {
                            target: target.to_string(),
                        }),
                    );
                }
            }
            // The stagger delay passed (or the deadline): start the next address.
            Some(None) | None => {
                if let Some(&addr) = addrs.get(next) {
                    next += 1;
                    let left = deadline.saturating_duration_since(Instant::now());
                    attempts.push(attempt(addr, left.max(Duration::from_millis(1))));
                }
            }
        }
    }
}

fn host_for_authority(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

async fn http_connect(
    mut stream: TcpStream,
    proxy: &str,
    host: &str,
    port: u16,
    authorization: Option<&str>,
) -> Result<Connected, DataplaneError> {
    let authority = format!("{}:{port}", host_for_authority(host));
    let mut req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(auth) = authorization {
        req.push_str("Proxy-Authorization: ");
        req.push_str(auth);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    let fail = |reason: String, refused: bool| DataplaneError::UpstreamProxy {
        proxy: proxy.to_owned(),
        reason,
        refused,
    };
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| fail(e.to_string(), false))?;
    let limits = HeadLimits::default();
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        match http1::parse_response_head(&buf, &limits) {
            Ok(Some((head, used))) => {
                if !(200..300).contains(&head.status) {
                    let said = head.header("proxy-status").and_then(proxy_status_error);
                    let target = || authority.clone();
                    return Err(match said {
                        Some("connection_refused") => DataplaneError::OriginRefused {
                            proxy: proxy.to_owned(),
                            target: target(),
                        },
                        Some("destination_ip_unroutable" | "destination_unavailable") => {
                            DataplaneError::Unreachable {
                                proxy: proxy.to_owned(),
                                target: target(),
                            }
                        }
                        _ => fail(
                            format!(
                                "CONNECT {authority} answered {} {}",
                                head.status, head.reason
                            ),
                            head.status == 502 || head.status == 503,
                        ),
                    });
                }
                return Ok(Connected {
                    stream: BackendStream::Tcp(stream),
                    early_data: buf.split_off(used),
                });
            }
            Ok(None) => {}
            Err(e) => return Err(fail(format!("bad CONNECT reply: {e}"), false)),
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| fail(e.to_string(), false))?;
        if n == 0 {
            return Err(fail("closed during CONNECT".into(), false));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The `error` parameter of an RFC 9209 `Proxy-Status` header value's first member (the
/// intermediary nearest the origin: the one that tried to connect).
fn proxy_status_error(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?;
    let first = value.split(',').next()?;
    first.split(';').skip(1).find_map(|param| {
        let (key, v) = param.trim().split_once('=')?;
        (key.trim() == "error").then(|| v.trim().trim_matches('"'))
    })
}

async fn read_until<T>(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, socks5::Socks5Error>,
) -> Result<T, String> {
    let mut chunk = [0u8; 512];
    loop {
        match parse(buf) {
            Ok(Some((v, used))) => {
                buf.drain(..used);
                return Ok(v);
            }
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed during handshake".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn socks5_connect(
    mut stream: TcpStream,
    proxy: &str,
    host: &str,
    port: u16,
    credentials: Option<&(String, String)>,
) -> Result<Connected, DataplaneError> {
    let target = match host.parse() {
        Ok(ip) => socks5::TargetAddr::Ip(SocketAddr::new(ip, port)),
        Err(_) => socks5::TargetAddr::Domain(host.to_owned(), port),
    };
    let (_bound, early_data) = socks5_request(
        &mut stream,
        proxy,
        socks5::Command::Connect,
        &target,
        credentials,
    )
    .await?;
    Ok(Connected {
        stream: BackendStream::Tcp(stream),
        early_data,
    })
}

/// Greets the SOCKS5 proxy, authenticates and sends one request; returns the reply's bound
/// address and whatever the proxy sent after the reply.
async fn socks5_request(
    stream: &mut TcpStream,
    proxy: &str,
    command: socks5::Command,
    target: &socks5::TargetAddr,
    credentials: Option<&(String, String)>,
) -> Result<(socks5::TargetAddr, Vec<u8>), DataplaneError> {
    let fail = |reason: String, refused: bool| DataplaneError::UpstreamProxy {
        proxy: proxy.to_owned(),
        reason,
        refused,
    };
    let mut out = Vec::with_capacity(300);
    let methods: &[u8] = if credentials.is_some() { &[0, 2] } else { &[0] };
    socks5::encode_greeting(methods, &mut out);
    stream
        .write_all(&out)
        .await
        .map_err(|e| fail(e.to_string(), false))?;
    let mut buf = Vec::new();
    let method = read_until(stream, &mut buf, socks5::parse_method_selection)
        .await
        .map_err(|e| fail(e, false))?;
    match (method, credentials) {
        (0, _) => {}
        (2, Some((user, pass))) => {
            out.clear();
            socks5::encode_userpass(user, pass, &mut out)
                .map_err(|e| fail(e.to_string(), false))?;
            stream
                .write_all(&out)
                .await
                .map_err(|e| fail(e.to_string(), false))?;
            let ok = read_until(stream, &mut buf, socks5::parse_userpass_status)
                .await
                .map_err(|e| fail(e, false))?;
            if !ok {
                return Err(fail("credentials rejected".into(), false));
            }
        }
        (m, _) => return Err(fail(format!("no acceptable auth method ({m:#x})"), false)),
    }
    out.clear();
    socks5::encode_request(command, target, &mut out).map_err(|e| fail(e.to_string(), false))?;
    stream
        .write_all(&out)
        .await
        .map_err(|e| fail(e.to_string(), false))?;
    let (code, bound) = read_until(stream, &mut buf, socks5::parse_reply)
        .await
        .map_err(|e| fail(e, false))?;
    if code != 0 {
        let what = match command {
            socks5::Command::Connect => "CONNECT",
            socks5::Command::UdpAssociate => "UDP ASSOCIATE",
            socks5::Command::Bind => "BIND",
        };
        let unreachable = [
            socks5::ReplyCode::NetworkUnreachable as u8,
            socks5::ReplyCode::HostUnreachable as u8,
        ];
        return Err(match command {
            // the proxy's word on the destination (an association's failure is the proxy's)
            socks5::Command::Connect if code == socks5::ReplyCode::ConnectionRefused as u8 => {
                DataplaneError::OriginRefused {
                    proxy: proxy.to_owned(),
                    target: target.to_string(),
                }
            }
            socks5::Command::Connect if unreachable.contains(&code) => {
                DataplaneError::Unreachable {
                    proxy: proxy.to_owned(),
                    target: target.to_string(),
                }
            }
            _ => fail(
                format!("{what} {target} failed with reply {code}"),
                code == socks5::ReplyCode::ConnectionRefused as u8,
            ),
        });
    }
    Ok((bound, buf))
}

/// A UDP association with an upstream SOCKS5 proxy: the control connection (the association
/// lives as long as it is open) and the proxy's relay address for the datagrams.
pub struct UdpAssociation {
    pub control: TcpStream,
    pub relay: SocketAddr,
}

impl Dialer<'_> {
    /// Opens a UDP association (RFC 1928 UDP ASSOCIATE) with the SOCKS5 proxy `host:port`.
    /// The client's UDP address is left unspecified: the proxy takes it from the first datagram.
    pub async fn socks5_udp_associate(
        &self,
        host: &str,
        port: u16,
        credentials: Option<&(String, String)>,
    ) -> Result<UdpAssociation, DataplaneError> {
        let deadline = Instant::now() + self.timeout;
        let mut control = self.connect_host(host, port, deadline).await?;
        let proxy = format!("{host}:{port}");
        let any = socks5::TargetAddr::Ip(SocketAddr::from(([0, 0, 0, 0], 0)));
        let request = socks5_request(
            &mut control,
            &proxy,
            socks5::Command::UdpAssociate,
            &any,
            credentials,
        );
        let (bound, _) = within(deadline, &proxy, request).await?;
        let relay = match bound {
            // "the same address as the control connection" (a proxy behind NAT, or one bound
            // to every interface, answers 0.0.0.0)
            socks5::TargetAddr::Ip(a) if a.ip().is_unspecified() => {
                let peer = control
                    .peer_addr()
                    .map_err(|e| DataplaneError::UpstreamProxy {
                        proxy: proxy.clone(),
                        reason: e.to_string(),
                        refused: false,
                    })?;
                SocketAddr::new(peer.ip(), a.port())
            }
            socks5::TargetAddr::Ip(a) => a,
            socks5::TargetAddr::Domain(name, _) => {
                return Err(DataplaneError::UpstreamProxy {
                    proxy,
                    reason: format!("UDP relay named by domain ({name}) is not supported"),
                    refused: false,
                })
            }
        };
        Ok(UdpAssociation { control, relay })
    }
}

#[cfg(test)]
mod tests {
    use super::proxy_status_error;

    #[test]
    fn the_proxy_status_error_type_is_read_from_the_first_member() {
        let read = |v: &str| proxy_status_error(v.as_bytes()).map(str::to_owned);
        assert_eq!(
            read("switchyard; error=connection_refused").as_deref(),
            Some("connection_refused")
        );
        assert_eq!(
            read("proxy.example; received-status=502; error=\"destination_ip_unroutable\"")
                .as_deref(),
            Some("destination_ip_unroutable")
        );
        // the first member is the proxy nearest the origin: the one that tried to connect
        assert_eq!(
            read("near; error=connection_timeout, far; error=connection_refused").as_deref(),
            Some("connection_timeout")
        );
        assert_eq!(read("switchyard"), None);
        assert_eq!(read(""), None);
        assert_eq!(proxy_status_error(&[0xff, 0xfe]), None);
    }
}
