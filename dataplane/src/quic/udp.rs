//! The UDP socket of a QUIC endpoint: glommio's socket to wait for datagrams, and a duplicate
//! descriptor for non-blocking sends. Sends go straight to `sendmsg(2)` (a UDP send rarely
//! blocks, and a syscall is cheaper than a ring round trip per packet); only a full socket
//! buffer falls back to glommio's awaited send.
//!
//! GSO: a transmit of several equal-sized datagrams goes out in one `sendmsg` with a
//! `UDP_SEGMENT` control message (what quinn-udp does), built with socket2's safe `MsgHdr`.
//! A kernel that refuses it turns GSO off for the socket and the segments go one by one.
//! GRO is not used: glommio's `recv_from` cannot return the control message that carries the
//! segment size of a coalesced read, so every datagram is received on its own.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::cell::Cell;
use std::io::{self, IoSlice};
use std::net::SocketAddr;

/// Kernel buffers: a connection's window of datagrams in flight.
const RECV_BUFFER: usize = 4 << 20;
const SEND_BUFFER: usize = 4 << 20;
/// Most datagrams quinn-proto may batch into one GSO transmit.
pub(crate) const MAX_GSO_SEGMENTS: usize = 10;

pub(crate) struct UdpPort {
    socket: glommio::net::UdpSocket,
    raw: Socket,
    /// The same socket for non-blocking receives of what is already queued.
    queued: std::net::UdpSocket,
    gso: Cell<bool>,
}

impl UdpPort {
    /// A socket bound to `addr`, or the one given (already bound).
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() && addr.ip().is_unspecified() {
            let _ = s.set_only_v6(false);
        }
        s.bind(&addr.into())?;
        Self::from_socket(s)
    }

    pub fn from_socket(s: Socket) -> io::Result<Self> {
        s.set_nonblocking(true)?;
        let _ = s.set_recv_buffer_size(RECV_BUFFER);
        let _ = s.set_send_buffer_size(SEND_BUFFER);
        let raw = s.try_clone()?;
        let queued: std::net::UdpSocket = s.try_clone()?.into();
        let std_socket: std::net::UdpSocket = s.into();
        let socket = glommio::net::UdpSocket::from(socket2_04::Socket::from(std_socket));
        Ok(Self {
            socket,
            raw,
            queued,
            gso: Cell::new(true),
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.raw.local_addr().ok()?.as_socket()
    }

    /// How many datagrams one transmit may carry.
    pub fn max_segments(&self) -> usize {
        if self.gso.get() {
            MAX_GSO_SEGMENTS
        } else {
            1
        }
    }

    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.socket.recv_from(buf).await.map_err(io::Error::from)
    }

    /// A datagram already queued on the socket, without waiting (`WouldBlock` when none): a
    /// burst is taken in one go, one `recvfrom(2)` each, instead of a ring round trip each.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.queued.recv_from(buf)
    }

    /// Sends `data` to `to`: one datagram, or `segment`-sized datagrams back to back.
    pub async fn send(
        &self,
        to: SocketAddr,
        data: &[u8],
        segment: Option<usize>,
    ) -> io::Result<()> {
        let Some(segment) = segment.filter(|s| *s > 0 && data.len() > *s) else {
            return self.send_one(to, data).await;
        };
        if self.gso.get() {
            match send_segmented(&self.raw, to, data, segment) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if gso_refused(&e) => {
                    tracing::info!(error = %e, "UDP segmentation offload refused; sending QUIC datagrams one by one");
                    self.gso.set(false);
                }
                Err(e) => return Err(e),
            }
        }
        for chunk in data.chunks(segment) {
            self.send_one(to, chunk).await?;
        }
        Ok(())
    }

    async fn send_one(&self, to: SocketAddr, data: &[u8]) -> io::Result<()> {
        match self.raw.send_to(data, &to.into()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self
                .socket
                .send_to(data, to)
                .await
                .map(|_| ())
                .map_err(io::Error::from),
            Err(e) => Err(e),
        }
    }
}

/// One `sendmsg(2)` with `UDP_SEGMENT`: the kernel cuts `data` into `segment`-byte datagrams.
fn send_segmented(raw: &Socket, to: SocketAddr, data: &[u8], segment: usize) -> io::Result<usize> {
    send_segments(raw, to, &[IoSlice::new(data)], segment)
}

/// One non-blocking `sendmsg(2)` with `UDP_SEGMENT` of the buffers `bufs` back to back: the
/// kernel cuts them into `segment`-byte datagrams (the mesh passes one buffer per datagram).
pub(crate) fn send_segments(
    raw: &Socket,
    to: SocketAddr,
    bufs: &[IoSlice<'_>],
    segment: usize,
) -> io::Result<usize> {
    let segment =
        u16::try_from(segment).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let control = udp_segment_cmsg(segment);
    let addr = SockAddr::from(to);
    let msg = socket2::MsgHdr::new()
        .with_addr(&addr)
        .with_buffers(bufs)
        .with_control(&control);
    raw.sendmsg(&msg, libc::MSG_DONTWAIT)
}

/// Whether a failed `UDP_SEGMENT` send means the kernel (or the route) does not take GSO:
/// the caller then sends datagram by datagram from now on.
pub(crate) fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

/// The control message `SOL_UDP`/`UDP_SEGMENT` carrying a `u16`, laid out as `CMSG_SPACE`
/// requires: a `cmsghdr` (length, level, type), then the data, padded to the header's alignment.
fn udp_segment_cmsg(segment: u16) -> Vec<u8> {
    let header = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::align_of::<libc::cmsghdr>();
    let len = header + std::mem::size_of::<u16>();
    let space = len.div_ceil(align) * align;
    let mut out = Vec::with_capacity(space);
    // struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; } on Linux
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&libc::SOL_UDP.to_ne_bytes());
    out.extend_from_slice(&libc::UDP_SEGMENT.to_ne_bytes());
    out.extend_from_slice(&segment.to_ne_bytes());
    out.resize(space, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segmented_send_arrives_as_separate_datagrams() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        let tx = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
        let to = rx.local_addr().expect("addr");
        let data: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
        send_segmented(&tx, to, &data, 1000).expect("GSO send");
        let mut buf = [0u8; 4096];
        let sizes: Vec<usize> = (0..3)
            .map(|_| rx.recv_from(&mut buf).expect("recv").0)
            .collect();
        assert_eq!(sizes, [1000, 1000, 500]);
    }
}
