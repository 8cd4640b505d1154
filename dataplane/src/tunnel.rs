//! Byte relay between two sockets (CONNECT, SOCKS5, and HTTP bodies). Both directions run in one
//! task; each borrows its streams only for the duration of a synchronous poll, so neither holds a
//! borrow across an await. Buffers come from [`crate::buffer_pool`] and only while data is in
//! hand. Half-closes propagate (EOF on one side → FIN on the other); the tunnel ends when both
//! directions are done, on an error, or after `idle` without traffic either way.
//!
//! Between two kernel sockets a direction that has moved [`splice::BULK_BYTES`] switches to
//! `splice(2)` through a pipe ([`crate::splice`]): no copy through user space. A WireGuard
//! flow has no socket and always copies; `SWITCHYARD_RELAY=copy` turns splicing off (bench A/B).

use crate::backend_stream::{HalfClose, KernelSocket};
use crate::buffer_pool;
use crate::counters::CoreCounters;
use crate::rate_limit::{BandwidthLimiter, Take};
use crate::splice;
use futures_lite::io::{AsyncRead, AsyncWrite};
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Where the bytes of one direction are counted and shaped.
pub struct Meter<'a> {
    pub counters: [&'a CoreCounters; 2],
    pub live: Option<&'a crate::live::LiveConnection>,
    /// true: client → upstream (counted as received from the client)
    pub upload: bool,
    pub limiter: Option<&'a BandwidthLimiter>,
    pub client: IpAddr,
    /// The VPN path's byte totals, for a flow that does not cross the TUN pump.
    pub vpn_tally: Option<&'a crate::tun::TunStats>,
}

impl Meter<'_> {
    pub(crate) fn count(&self, n: u64) {
        for c in self.counters {
            if self.upload {
                c.add_received(n);
            } else {
                c.add_sent(n);
            }
        }
        if let Some(live) = self.live {
            if self.upload {
                live.add_recv(n);
            } else {
                live.add_sent(n);
            }
        }
        if let Some(tally) = self.vpn_tally {
            // the pump's sense: "sent" is from the application into the tunnel
            let total = if self.upload {
                &tally.bytes_sent
            } else {
                &tally.bytes_received
            };
            total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Bytes already [`count`](Self::count)ed that went through `splice(2)`.
    pub(crate) fn count_spliced(&self, n: u64) {
        for c in self.counters {
            c.add_spliced(n);
        }
    }

    pub(crate) async fn shape(&self, n: usize) {
        let Some(limiter) = self.limiter else { return };
        let mut left = n as u64;
        while left > 0 {
            let chunk = left.min(limiter.max_chunk());
            match limiter.take(self.client, chunk) {
                Take::Granted => left -= chunk,
                Take::Wait(d) => glommio::timer::sleep(d).await,
            }
        }
    }
}

/// Reads into a pooled buffer; the buffer is returned to the pool while the read is pending.
pub async fn read_pooled<S: AsyncRead + Unpin>(
    from: &RefCell<S>,
) -> io::Result<(Box<[u8]>, usize)> {
    poll_fn(|cx| {
        let mut buf = buffer_pool::take();
        let r = Pin::new(&mut *from.borrow_mut()).poll_read(cx, &mut buf);
        match r {
            Poll::Ready(Ok(n)) => Poll::Ready(Ok((buf, n))),
            Poll::Ready(Err(e)) => {
                buffer_pool::give(buf);
                Poll::Ready(Err(e))
            }
            Poll::Pending => {
                buffer_pool::give(buf);
                Poll::Pending
            }
        }
    })
    .await
}

pub async fn write_all<S: AsyncWrite + Unpin>(to: &RefCell<S>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let n = poll_fn(|cx| Pin::new(&mut *to.borrow_mut()).poll_write(cx, data)).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        data = &data[n..];
    }
    Ok(())
}

/// Ends a direction whose source reached its end: a FIN to `to` (`shutdown(2)`), unless the
/// other direction has already ended and `to` is a kernel socket. Then this was the relay's
/// last direction, its caller closes both sockets right after it returns, and `close(2)` sends
/// the FIN: both sockets have been read to their end of stream, so the close cannot turn into
/// a reset (unread data), and one `shutdown(2)` per tunnel is saved. A user-space flow is
/// always shut down (its close may not mean a FIN).
fn end_direction<W: HalfClose + KernelSocket>(to: &RefCell<W>, one_ended: &Cell<bool>) {
    let last = one_ended.replace(true);
    if last && to.borrow().socket_fd().is_some() {
        return;
    }
    to.borrow().shutdown_write();
}

async fn pump<
    R: AsyncRead + KernelSocket + Unpin,
    W: AsyncWrite + HalfClose + KernelSocket + Unpin,
>(
    from: &RefCell<R>,
    to: &RefCell<W>,
    meter: &Meter<'_>,
    last_activity: &Cell<Instant>,
    sockets: Option<(RawFd, RawFd)>,
    one_ended: &Cell<bool>,
) -> io::Result<()> {
    let mut moved = 0u64;
    loop {
        if let Some((from_fd, to_fd)) = sockets.filter(|_| moved >= splice::BULK_BYTES) {
            // boxed: its state would otherwise sit in every tunnel, bulk or idle
            Box::pin(splice::pump(
                from,
                to,
                (from_fd, to_fd),
                meter,
                last_activity,
            ))
            .await?;
            end_direction(to, one_ended);
            return Ok(());
        }
        let (buf, n) = read_pooled(from).await?;
        if n == 0 {
            buffer_pool::give(buf);
            end_direction(to, one_ended);
            return Ok(());
        }
        last_activity.set(Instant::now());
        if meter.limiter.is_some() {
            // boxed for the same reason: only shaped tunnels wait here
            Box::pin(meter.shape(n)).await;
        }
        let written = write_all(to, &buf[..n]).await;
        buffer_pool::give(buf);
        written?;
        last_activity.set(Instant::now());
        meter.count(n as u64);
        moved += n as u64;
    }
}

/// Relays until both directions finish, one fails, or the tunnel is idle for `idle`. The
/// caller closes both streams when this returns (see [`end_direction`]).
pub async fn relay<C, U>(
    client: &RefCell<C>,
    upstream: &RefCell<U>,
    up: Meter<'_>,
    down: Meter<'_>,
    idle: Duration,
) where
    C: AsyncRead + AsyncWrite + HalfClose + KernelSocket + Unpin,
    U: AsyncRead + AsyncWrite + HalfClose + KernelSocket + Unpin,
{
    let last = Cell::new(Instant::now());
    let one_ended = Cell::new(false);
    let sockets = match (client.borrow().socket_fd(), upstream.borrow().socket_fd()) {
        (Some(c), Some(u)) if splice::enabled() => Some((c, u)),
        _ => None,
    };
    // try_zip ends at the first error: a reset on either side ends the tunnel. The two pumps
    // go straight into it: named locals moved into the zip would keep their own slots in
    // the tunnel's state.
    let both = async {
        let _ = futures_lite::future::try_zip(
            pump(client, upstream, &up, &last, sockets, &one_ended),
            pump(
                upstream,
                client,
                &down,
                &last,
                sockets.map(|(c, u)| (u, c)),
                &one_ended,
            ),
        )
        .await;
    };
    let watchdog = async {
        loop {
            let since = last.get().elapsed();
            if since >= idle {
                return;
            }
            glommio::timer::sleep(idle - since).await;
        }
    };
    futures_lite::future::or(both, watchdog).await;
}
