//! The stream a backend connector hands back: a kernel TCP socket (direct, upstream proxies),
//! a flow inside a user-space WireGuard tunnel, or a stream of a QUIC connection. Relays, the origin pool and the cache read
//! and write it through `AsyncRead`/`AsyncWrite` and [`HalfClose`], whichever it is.

use crate::wireguard::FlowStream;
use futures_lite::io::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Ending one direction of a stream (FIN) while the other keeps flowing.
pub trait HalfClose {
    fn shutdown_write(&self);
}

impl HalfClose for TcpStream {
    fn shutdown_write(&self) {
        crate::sys::shutdown_write(self.as_raw_fd());
    }
}

impl HalfClose for FlowStream {
    fn shutdown_write(&self) {
        FlowStream::shutdown_write(self)
    }
}

/// The kernel socket behind a stream, if there is one: a relay between two of them can splice.
pub trait KernelSocket {
    fn socket_fd(&self) -> Option<RawFd>;

    /// Waits until the socket is readable (`write == false`) or has room to write, without
    /// moving bytes (the caller splices); readiness may be stale, so the caller retries and
    /// waits again on `WouldBlock`. Only called when [`socket_fd`](Self::socket_fd) is `Some`.
    fn poll_ready(&mut self, cx: &mut Context<'_>, write: bool) -> Poll<io::Result<()>>;
}

impl KernelSocket for TcpStream {
    fn socket_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>, write: bool) -> Poll<io::Result<()>> {
        if write {
            self.poll_writable(cx)
        } else {
            self.poll_readable(cx)
        }
    }
}

fn no_kernel_socket() -> Poll<io::Result<()>> {
    Poll::Ready(Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "a flow in user space has no socket readiness",
    )))
}

#[derive(Debug)]
pub enum BackendStream {
    Tcp(TcpStream),
    Wireguard(FlowStream),
    /// A stream of a QUIC connection to a switchyard server.
    Quic(FlowStream),
}

impl BackendStream {
    /// Kernel read timeout; a tunnel flow relies on the callers' own timers.
    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(d).map_err(io::Error::from),
            Self::Wireguard(_) | Self::Quic(_) => Ok(()),
        }
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_write_timeout(d).map_err(io::Error::from),
            Self::Wireguard(_) | Self::Quic(_) => Ok(()),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Self::Tcp(s) => s.local_addr().map_err(io::Error::from),
            Self::Wireguard(f) | Self::Quic(f) => Ok(f.local_addr()),
        }
    }

    /// For a pooled idle connection: not closed by the peer and no stray bytes waiting.
    ///
    /// `retryable`: the caller retries its request on a fresh connection if this one turns
    /// out closed. Then a kernel socket whose read-readiness poll is still pending counts as
    /// clean without asking the socket (a `MSG_PEEK` per reused connection saved); the poll's
    /// answer may lag by the completions not reaped yet, a window the retry covers (as it
    /// covers an origin closing just after a peek).
    pub fn idle_is_clean(&self, retryable: bool) -> bool {
        match self {
            Self::Tcp(s) if retryable && s.read_poll_pending() => true,
            Self::Tcp(s) => crate::sys::idle_socket_is_clean(s.as_raw_fd()),
            Self::Wireguard(f) | Self::Quic(f) => f.idle_is_clean(),
        }
    }
}

impl HalfClose for BackendStream {
    fn shutdown_write(&self) {
        match self {
            Self::Tcp(s) => s.shutdown_write(),
            Self::Wireguard(f) | Self::Quic(f) => f.shutdown_write(),
        }
    }
}

/// A tunnel or QUIC flow lives in user space: its relay copies.
impl KernelSocket for FlowStream {
    fn socket_fd(&self) -> Option<RawFd> {
        None
    }

    fn poll_ready(&mut self, _: &mut Context<'_>, _: bool) -> Poll<io::Result<()>> {
        no_kernel_socket()
    }
}

impl KernelSocket for BackendStream {
    fn socket_fd(&self) -> Option<RawFd> {
        match self {
            Self::Tcp(s) => s.socket_fd(),
            Self::Wireguard(_) | Self::Quic(_) => None,
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>, write: bool) -> Poll<io::Result<()>> {
        match self {
            Self::Tcp(s) => s.poll_ready(cx, write),
            Self::Wireguard(_) | Self::Quic(_) => no_kernel_socket(),
        }
    }
}

impl AsyncRead for BackendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Wireguard(f) | Self::Quic(f) => Pin::new(f).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Self::Wireguard(f) | Self::Quic(f) => Pin::new(f).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Wireguard(f) | Self::Quic(f) => Pin::new(f).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_close(cx),
            Self::Wireguard(f) | Self::Quic(f) => Pin::new(f).poll_close(cx),
        }
    }
}
