//! The few raw syscalls the data plane needs that glommio does not wrap. Every `unsafe` block of
//! the crate lives here.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Shuts down the write half of a socket synchronously (a FIN to the peer), so a tunnel can
/// half-close one side while the other direction keeps running on the same stream.
pub fn shutdown_write(fd: RawFd) {
    // SAFETY: shutdown(2) on a descriptor we own through a live stream; errors (already closed,
    // not connected) are harmless here and ignored on purpose.
    unsafe {
        libc::shutdown(fd, libc::SHUT_WR);
    }
}

/// Whether an idle pooled connection is still usable: no pending bytes and no EOF/error.
/// A non-blocking `MSG_PEEK` answers without disturbing the stream.
pub fn idle_socket_is_clean(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) into a valid one-byte buffer on a descriptor owned by a live stream.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let err = io::Error::last_os_error();
        return err.kind() == io::ErrorKind::WouldBlock;
    }
    // 0 = the origin closed; >0 = unsolicited bytes, the connection is out of sync.
    false
}

/// Sets a socket option of type `int` (e.g. `SO_RCVBUF`) on a descriptor glommio owns (its
/// sockets do not lend themselves to socket2).
pub fn set_int_sockopt(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    set_sockopt(fd, level, name, &value)
}

/// Sets socket option `name` to the plain C value `value` (an int, a `linger`).
fn set_sockopt<T: Copy>(fd: RawFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: setsockopt(2) reads `size_of::<T>()` bytes from a live `T` the caller lends, on
    // a descriptor owned by a live socket; `T` is a plain C option value (Copy, no pointers
    // the kernel would follow).
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Raises the soft open-files limit to the hard limit (a proxy holds two sockets per tunnel).
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a properly sized struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(lim.rlim_cur)
}

/// Online CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        if cpus.is_empty() {
            vec![0]
        } else {
            cpus
        }
    }
}

/// Wraps a listening socket created by the engine into a glommio listener on this core.
pub fn listener_from_fd(fd: RawFd) -> glommio::net::TcpListener {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` comes from `IntoRawFd` of a listening socket2::Socket; ownership moves here.
    unsafe { glommio::net::TcpListener::from_raw_fd(fd) }
}

/// Creates (or attaches to) the TUN device `name`: layer 3, no packet-info header. The device
/// is not persistent: it disappears when the last descriptor closes, so a killed process leaves
/// no device behind.
///
/// The device is opened with a virtio-net header before each packet (`IFF_VNET_HDR`) and with
/// checksum and TCP segmentation offload (`TUNSETOFFLOAD`), so the kernel passes TCP in 64 KiB
/// super-packets (see `tun::vnet`); a kernel that refuses either gets a plain device or one
/// without offloads. [`tun_has_vnet_hdr`] tells the reader which it got.
pub fn open_tun(name: &str) -> io::Result<std::fs::File> {
    match open_tun_with(name, libc::IFF_VNET_HDR) {
        Ok(file) => {
            let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
            // SAFETY: TUNSETOFFLOAD on an open TUN descriptor; the argument is passed by value.
            let rc = unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    libc::TUNSETOFFLOAD,
                    libc::c_ulong::from(offloads),
                )
            };
            if rc < 0 {
                tracing::info!(device = name, error = %io::Error::last_os_error(),
                    "TUN offloads refused: the VPN path moves one segment per packet");
            }
            Ok(file)
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open_tun_with(name, 0),
        Err(e) => Err(e),
    }
}

/// Creates (or attaches to) the TAP device `name`: Ethernet frames, no packet-info header.
pub fn open_tap(name: &str) -> io::Result<std::fs::File> {
    open_tun_with(name, libc::IFF_TAP)
}

/// Wraps a bound std UDP socket into a glommio socket on this core.
pub fn udp_from_std(socket: std::net::UdpSocket) -> glommio::net::UdpSocket {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let fd = socket.into_raw_fd();
    // SAFETY: `fd` comes from `IntoRawFd` of a bound UDP socket; ownership moves here.
    unsafe { glommio::net::UdpSocket::from_raw_fd(fd) }
}

fn open_tun_with(name: &str, extra_flags: libc::c_int) -> io::Result<std::fs::File> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid interface name {name:?}"),
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: an all-zero ifreq is a valid value (a C struct of integers and arrays).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // IFF_TAP in `extra_flags` asks for a layer-2 device instead
    let kind = if extra_flags & libc::IFF_TAP != 0 {
        0
    } else {
        libc::IFF_TUN
    };
    req.ifr_ifru.ifru_flags = (kind | libc::IFF_NO_PI | extra_flags) as libc::c_short;
    use std::os::fd::AsRawFd;
    // SAFETY: TUNSETIFF on the descriptor just opened, with a pointer to a live ifreq.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// Whether the TUN device behind `fd` puts a virtio-net header before each packet.
pub fn tun_has_vnet_hdr(fd: RawFd) -> io::Result<bool> {
    // SAFETY: an all-zero ifreq is a valid value (a C struct of integers and arrays).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: TUNGETIFF fills the live ifreq it is given.
    let rc = unsafe { libc::ioctl(fd, libc::TUNGETIFF, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TUNGETIFF sets the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    Ok(libc::c_int::from(flags) & libc::IFF_VNET_HDR != 0)
}

/// Waits up to `timeout_ms` for `fd` to become readable; `Ok(false)` on timeout.
pub fn wait_readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(n > 0)
}

/// Sets `IP_FREEBIND`, so a listener can bind to an address (the TUN's) before it exists.
pub fn set_freebind(fd: RawFd) -> io::Result<()> {
    set_int_sockopt(fd, libc::IPPROTO_IP, libc::IP_FREEBIND, 1)
}

/// Makes closing the TCP socket `fd` send a reset instead of a FIN (`SO_LINGER` 0): a refused
/// VPN flow ends for its application at once with "connection reset", not as a clean close.
pub fn set_reset_on_close(fd: RawFd) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    set_sockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &linger)
}

/// Sets `O_NONBLOCK` on `fd` (the TUN pump reads until `EAGAIN` and only then polls).
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(2) F_GETFL/F_SETFL on a descriptor the caller owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A pipe, both ends non-blocking and close-on-exec: the in-kernel buffer of a splice relay.
pub fn pipe_nonblocking() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2(2) writes two descriptors into a live two-element array.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Asks for a pipe buffer of `bytes` (F_SETPIPE_SZ); returns the size the kernel granted.
pub fn set_pipe_size(fd: RawFd, bytes: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: fcntl(2) F_SETPIPE_SZ with an int argument on a pipe the caller owns.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, want) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// One non-blocking `splice(2)` of up to `len` bytes from `from` to `to` (one of them a pipe).
/// `Ok(0)` means end of stream on `from`; `WouldBlock` means no data or no room right now.
pub fn splice(from: RawFd, to: RawFd, len: usize, more: bool) -> io::Result<usize> {
    let mut flags = libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE;
    if more {
        flags |= libc::SPLICE_F_MORE;
    }
    // SAFETY: splice(2) between two descriptors owned by live streams/pipes, no offsets.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            flags,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `dup(2)` with close-on-exec: a second descriptor for the same open file (tests check seals
/// through it).
#[cfg(test)]
pub fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(2) F_DUPFD_CLOEXEC on a descriptor owned by a live stream.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// A memfd holding `bytes`, sealed against any change (size and content), and a read-only
/// mapping of it. The seals make the mapping safe: no process can truncate the file under it.
pub fn sealed_memfd(name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<(OwnedFd, memmap2::Mmap)> {
    use std::io::Write;
    // SAFETY: memfd_create(2) with a NUL-terminated name; the result is checked below.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl(2) F_ADD_SEALS with an int argument on the memfd we own.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the file is sealed against shrinking and writes, so the mapped bytes can neither
    // change nor disappear (no SIGBUS) while the map lives.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok((OwnedFd::from(file), map))
}

/// One non-blocking `send(2)` with `MSG_MORE`: the kernel holds a partial segment for the bytes
/// that follow at once (a response head before its body) instead of sending it on its own.
pub fn send_more(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    let flags = libc::MSG_MORE | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    // SAFETY: send(2) from a live buffer of `buf.len()` bytes on a socket the caller owns.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// One `sendfile(2)` of up to `len` bytes of `file` from `offset` to socket `to` (non-blocking
/// when `to` is): `WouldBlock` when the socket has no room.
pub fn sendfile(to: RawFd, file: RawFd, offset: u64, len: usize) -> io::Result<usize> {
    let mut off = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: sendfile(2) between descriptors owned by live objects, with a live offset.
    let n = unsafe { libc::sendfile(to, file, &mut off, len) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Unmaps the pages of a private, never-written file mapping from this process (`madvise(2)`
/// `MADV_DONTNEED`): they stay in the page cache and the next access maps them again. Only for
/// mappings whose pages equal the file's (code): a written private page would be lost.
pub fn drop_file_pages(start: usize, len: usize) -> io::Result<()> {
    // SAFETY: the range is a whole mapping of this process read from /proc/self/maps; for a
    // private read-only file mapping MADV_DONTNEED only drops page-table entries, and later
    // accesses fault the same bytes back in from the file.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives the heap's free pages back to the kernel (glibc `malloc_trim(3)`): start-up frees
/// megabytes (the eBPF objects parsed and loaded, the OpenAPI document, configuration) that
/// malloc would otherwise keep resident. Returns whether memory was released.
pub fn trim_heap() -> bool {
    // SAFETY: malloc_trim only returns free heap memory to the kernel; it takes malloc's own
    // locks and touches no memory the program owns.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Whether the process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn detects_closed_and_dirty_connections() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (mut s, _) = l.accept().expect("accept");
        assert!(idle_socket_is_clean(c.as_raw_fd()));
        s.write_all(b"x").expect("write");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!idle_socket_is_clean(c.as_raw_fd()));
        let c2 = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s2, _) = l.accept().expect("accept");
        drop(s2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!idle_socket_is_clean(c2.as_raw_fd()));
    }

    #[test]
    fn cpus_and_limits() {
        assert!(!allowed_cpus().is_empty());
        assert!(raise_nofile_limit().expect("rlimit") > 0);
    }
}
