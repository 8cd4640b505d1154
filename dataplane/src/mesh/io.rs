//! The mesh's batched socket and device I/O (what runner.rs decides is done here in as few
//! system calls as the kernel allows):
//! - socket out: a run of equal-sized datagrams to one address (the segments of one TCP
//!   super-packet, encrypted) leaves in one `sendmsg(2)` with `UDP_SEGMENT` (GSO, the QUIC
//!   transport's helper); a kernel or route that refuses it turns GSO off for the socket;
//! - socket in: `UDP_GRO` lets one `recvmsg(2)` take a train of datagrams from one sender,
//!   cut apart by the segment size in its control message; glommio only waits for the
//!   socket to become readable (a peek), then the queue is drained without the ring;
//! - device in (a plain thread: a TUN descriptor cannot be awaited on glommio's ring): the
//!   device has a virtio-net header and TSO/checksum offload, so one read takes a TCP
//!   super-packet of up to 64 KiB, cut into its segments here ([`segment::split`]); the
//!   packets of several reads travel to the owner in one [`PacketBatch`] per hand-off, and the
//!   batches are recycled;
//! - device out: consecutive segments of one TCP flow are joined into one super-packet
//!   ([`segment::Coalescer`], GRO on the device side) and written with its virtio-net header;
//!   the owner flushes what is held at the end of each burst.

// recvmsg(2) with a control buffer (socket2's safe receive has no room for one here)
#![allow(unsafe_code)]

use super::segment::{self, Coalescer, PacketBatch};
use super::MeshShared;
use crate::tun::vnet::{self, VnetHeader};
use crossbeam_queue::ArrayQueue;
use socket2::Socket;
use std::cell::Cell;
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;

/// Kernel socket buffers: a few milliseconds of a fast stream.
const SOCKET_BUFFER: i32 = 4 << 20;
/// A device hand-off is sent once it holds this much (or the device has nothing more): about
/// one super-packet, so a batch's buffer stays near 64 KiB.
const BATCH_BYTES: usize = 32 << 10;
/// Batches in flight from the device reader to the owner (a full queue drops, as a router
/// would: ~1 MiB, a few milliseconds of a fast stream).
pub(super) const DEVICE_QUEUE: usize = 16;
/// Processed batches kept for reuse (the rest are freed: memory over allocations).
const SPARE_BATCHES: usize = 8;
/// One read from the device: the largest (super-)packet and its virtio-net header.
const DEVICE_READ: usize = 65_536 + vnet::LEN;
/// Room for a few control messages (`UDP_GRO` is one `int`).
const CONTROL: usize = 64;

/// The mesh UDP socket on the owner core.
pub(super) struct MeshSocket {
    /// For waiting until a datagram is queued, and for sends that found the buffer full.
    udp: glommio::net::UdpSocket,
    /// The same socket, for non-blocking batched sends and receives.
    raw: Socket,
    gso: Cell<bool>,
    /// The largest segment a GSO send carried …
    gso_carried: Cell<usize>,
    /// … and the smallest one refused for its size (the route's MTU: relay envelopes of a
    /// session through another member are larger than a direct session's datagrams). Runs of
    /// segments this large go one by one, the kernel fragmenting them.
    gso_too_large: Cell<usize>,
}

/// The UDP payload of a 1500-byte IPv4 packet: a GSO segment above it may be refused for its
/// size alone.
const ETHERNET_UDP_PAYLOAD: usize = 1472;

impl MeshSocket {
    pub fn new(socket: std::net::UdpSocket) -> io::Result<Self> {
        let raw = Socket::from(socket.try_clone()?);
        let fd = raw.as_raw_fd();
        // as root the buffers may exceed the sysctl maximum (what wireguard-go does)
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if crate::sys::set_int_sockopt(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
                let _ = crate::sys::set_int_sockopt(fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
            }
        }
        if let Err(e) = crate::sys::set_int_sockopt(fd, libc::SOL_UDP, libc::UDP_GRO, 1) {
            tracing::info!(error = %e, "UDP receive offload refused: mesh datagrams are read one by one");
        }
        Ok(MeshSocket {
            udp: crate::sys::udp_from_std(socket),
            raw,
            gso: Cell::new(true),
            gso_carried: Cell::new(0),
            gso_too_large: Cell::new(usize::MAX),
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.raw.local_addr().ok()?.as_socket()
    }

    /// Waits until a datagram is queued (it stays queued).
    pub async fn readable(&self) -> io::Result<()> {
        let mut one = [0u8; 1];
        self.udp
            .peek_from(&mut one)
            .await
            .map(|_| ())
            .map_err(io::Error::from)
    }

    /// One queued receive without waiting (`WouldBlock` when none): the bytes in `buf`, the
    /// sender, and the size of the datagrams they hold back to back (the GRO segment size;
    /// the whole length when the datagram came on its own).
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, usize)> {
        #[repr(C, align(8))]
        struct Control([u8; CONTROL]);
        let mut control = Control([0; CONTROL]);
        // SAFETY: an all-zero sockaddr_storage / msghdr is a valid value (C structs of
        // integers, arrays and null pointers).
        let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = CONTROL as _;
        // SAFETY: recvmsg(2) writes at most the lengths given into `buf`, `from` and `control`,
        // all live for the call, on a descriptor `raw` owns.
        let n = unsafe { libc::recvmsg(self.raw.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        // SAFETY: the kernel filled `from` with `msg_namelen` bytes of a socket address.
        let addr = unsafe { socket2::SockAddr::new(from, msg.msg_namelen) };
        let Some(from) = addr.as_socket() else {
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        };
        let used = (msg.msg_controllen as usize).min(CONTROL);
        let segment = segment::gro_segment_size(&control.0[..used]).unwrap_or(n);
        Ok((n, from, segment.max(1)))
    }

    /// Sends every datagram of `out` (in order): runs to one address in one GSO send each, the
    /// rest one by one; a full socket buffer is waited for. `out` is left as it was, for the
    /// caller to reuse its buffers (the runner's `recycle`) or drop.
    pub async fn send_all(&self, out: &[(SocketAddr, Vec<u8>)]) {
        let mut at = 0;
        while at < out.len() {
            let run = if self.gso.get() && out[at].1.len() < self.gso_too_large.get() {
                segment::gso_run(&out[at..])
            } else {
                1
            };
            let group = &out[at..at + run];
            at += run;
            let (to, first) = (&group[0].0, &group[0].1);
            let sent = if run == 1 {
                self.raw
                    .send_to_with_flags(first, &(*to).into(), libc::MSG_DONTWAIT)
            } else {
                let bufs: Vec<IoSlice<'_>> = group.iter().map(|(_, d)| IoSlice::new(d)).collect();
                crate::quic::udp::send_segments(&self.raw, *to, &bufs, first.len())
            };
            match sent {
                Ok(_) => {
                    if run > 1 && first.len() > self.gso_carried.get() {
                        self.gso_carried.set(first.len());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.send_waiting(group).await,
                Err(e)
                    if run > 1
                        && (crate::quic::udp::gso_refused(&e)
                            || e.raw_os_error() == Some(libc::EMSGSIZE))
                        && first.len() > self.gso_carried.get().max(ETHERNET_UDP_PAYLOAD) =>
                {
                    tracing::debug!(error = %e, size = first.len(), "UDP segmentation offload refused for segments this large; they go one by one");
                    self.gso_too_large.set(first.len());
                    self.send_waiting(group).await;
                }
                Err(e) if run > 1 && crate::quic::udp::gso_refused(&e) => {
                    tracing::info!(error = %e, "UDP segmentation offload refused; mesh datagrams go one by one");
                    self.gso.set(false);
                    self.send_waiting(group).await;
                }
                Err(e) => tracing::debug!(%to, error = %e, "mesh datagram not sent"),
            }
        }
    }

    async fn send_waiting(&self, group: &[(SocketAddr, Vec<u8>)]) {
        for (to, d) in group {
            if let Err(e) = self.udp.send_to(d, *to).await {
                tracing::debug!(%to, error = %e, "mesh datagram not sent");
            }
        }
    }
}

/// The mesh device as the owner core writes to it.
pub(super) struct Device {
    file: std::fs::File,
    /// Packets carry a virtio-net header (a TUN opened with offloads).
    vnet: bool,
    gro: Coalescer,
}

impl Device {
    pub fn new(file: std::fs::File) -> Self {
        let vnet = crate::sys::tun_has_vnet_hdr(file.as_raw_fd()).unwrap_or(false);
        Device {
            file,
            vnet,
            gro: Coalescer::default(),
        }
    }

    pub fn has_vnet_hdr(&self) -> bool {
        self.vnet
    }

    /// Writes one complete packet (or frame): at once without a virtio-net header, else
    /// possibly held to be joined with the next ones until [`Device::flush`].
    pub fn write(&mut self, packet: &[u8]) -> io::Result<()> {
        if !self.vnet {
            return self.file.write_all(packet);
        }
        let file = &mut self.file;
        let mut result = Ok(());
        self.gro.push(packet, &mut |hdr, p| {
            if let Err(e) = write_with_header(file, hdr, p) {
                result = Err(e);
            }
        });
        result
    }

    /// Writes what is held for joining.
    pub fn flush(&mut self) -> io::Result<()> {
        let file = &mut self.file;
        let mut result = Ok(());
        self.gro.flush(&mut |hdr, p| {
            if let Err(e) = write_with_header(file, hdr, p) {
                result = Err(e);
            }
        });
        result
    }
}

fn write_with_header(file: &mut std::fs::File, hdr: VnetHeader, packet: &[u8]) -> io::Result<()> {
    let hdr = hdr.to_bytes();
    file.write_vectored(&[IoSlice::new(&hdr), IoSlice::new(packet)])
        .map(|_| ())
}

/// The device reader's ends of the hand-off to the owner.
#[derive(Clone)]
pub(super) struct DeviceQueue {
    /// Batches of packets for the owner.
    pub full: Arc<ArrayQueue<PacketBatch>>,
    /// Batches the owner is done with, for reuse.
    pub spare: Arc<ArrayQueue<PacketBatch>>,
}

impl DeviceQueue {
    pub fn new() -> Self {
        DeviceQueue {
            full: Arc::new(ArrayQueue::new(DEVICE_QUEUE)),
            spare: Arc::new(ArrayQueue::new(SPARE_BATCHES)),
        }
    }

    /// Gives a processed batch back to the reader.
    pub fn recycle(&self, mut batch: PacketBatch) {
        batch.clear();
        let _ = self.spare.push(batch);
    }
}

/// Reads the device on a plain thread (blocking poll with a timeout, so the stop flag is
/// seen) and hands IPv4 packets (TUN) or frames (TAP) to the owner in batches; a full queue
/// drops, as a router would.
pub(super) fn read_device(
    layer2: bool,
    mut device: std::fs::File,
    queue: DeviceQueue,
    shared: Arc<MeshShared>,
) {
    let fd = device.as_raw_fd();
    let vnet = !layer2 && crate::sys::tun_has_vnet_hdr(fd).unwrap_or(false);
    if let Err(e) = crate::sys::set_nonblocking(fd) {
        tracing::error!(error = %e, "the mesh device cannot be made non-blocking");
        return;
    }
    let totals = &shared.totals;
    let mut buf = vec![0u8; DEVICE_READ];
    let mut batch = queue.spare.pop().unwrap_or_default();
    let hand_over = |batch: PacketBatch| {
        let packets = batch.len() as u64;
        if let Err(batch) = queue.full.push(batch) {
            totals.overflow.fetch_add(packets, Relaxed);
            queue.recycle(batch);
        }
        shared.wake.notify();
    };
    while !shared.stop.load(Acquire) {
        match device.read(&mut buf) {
            Ok(n) => {
                let (hdr, packet) = if vnet {
                    match VnetHeader::parse(&buf[..n]) {
                        Some(h) => (h, &mut buf[vnet::LEN..n]),
                        None => continue,
                    }
                } else {
                    (VnetHeader::default(), &mut buf[..n])
                };
                // the first packets are often IPv6 router solicitations: the mesh is IPv4
                let wanted = if layer2 {
                    packet.len() >= 14
                } else {
                    packet.len() >= 20 && packet[0] >> 4 == 4
                };
                if !wanted {
                    continue;
                }
                if segment::split(&hdr, packet, &mut batch).is_err() {
                    totals.invalid.fetch_add(1, Relaxed);
                }
                if batch.bytes() >= BATCH_BYTES {
                    let next = queue.spare.pop().unwrap_or_default();
                    hand_over(std::mem::replace(&mut batch, next));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !batch.is_empty() {
                    let next = queue.spare.pop().unwrap_or_default();
                    hand_over(std::mem::replace(&mut batch, next));
                }
                if let Err(e) = crate::sys::wait_readable(fd, 200) {
                    tracing::error!(error = %e, "polling the mesh device failed");
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::error!(error = %e, "reading the mesh device failed");
                return;
            }
        }
    }
}
