//! Zero-copy relay of one tunnel direction between two kernel TCP sockets: `splice(2)` moves the
//! bytes socket → pipe → socket inside the kernel (page references, no copy through user space).
//!
//! glommio 0.9 exposes neither `IORING_OP_SPLICE` nor a readiness wait, so the splices are
//! non-blocking syscalls (both sockets get `O_NONBLOCK`) and the waits go through glommio itself
//! on a private duplicate of each socket's descriptor (the originals sit in `RefCell`s the other
//! direction borrows): "readable" is a one-byte `MSG_PEEK` through io_uring; "writable" is
//! sending the pipe's next byte through glommio's write path, which waits for room and keeps the
//! byte order. io_uring's own splice op was not used: it runs in io-wq worker threads, so every
//! idle tunnel would park a kernel thread in a blocking splice.
//!
//! Pipes come from a per-core pool and are held only while bytes are in them; a direction
//! waiting for data holds none. Pipes are kernel memory (a ring of page references, pages only
//! while data is in flight), not the process's RSS.

use crate::sys;
use crate::tunnel::Meter;
use futures_lite::io::AsyncWriteExt;
use glommio::net::TcpStream;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::time::Instant;

/// A direction switches from copying to splicing after moving this much: short exchanges stay
/// on the copy path (no extra descriptors), bulk transfers splice.
pub const BULK_BYTES: u64 = 128 * 1024;

/// Requested pipe buffer (the default `fs.pipe-max-size`); larger means fewer syscalls per byte.
const PIPE_BYTES: usize = 1 << 20;
const MAX_POOLED: usize = 16;

/// Whether tunnels may splice: unless `SWITCHYARD_RELAY=copy` (for comparing the two paths in
/// the bench) or the kernel refuses splicing between sockets.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::env::var("SWITCHYARD_RELAY").map_or(true, |v| !v.eq_ignore_ascii_case("copy"))
    })
}

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (read, write) = sys::pipe_nonblocking()?;
        // Over the per-user pipe budget (unprivileged, many bulk tunnels) the kernel refuses a
        // bigger buffer: the default 64 KiB one still works, with more syscalls per byte.
        let capacity = sys::set_pipe_size(write.as_raw_fd(), PIPE_BYTES).unwrap_or(64 * 1024);
        Ok(Self {
            read,
            write,
            capacity,
        })
    }
}

thread_local! {
    static PIPES: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

fn take_pipe() -> io::Result<Pipe> {
    match PIPES.with(|p| p.borrow_mut().pop()) {
        Some(p) => Ok(p),
        None => Pipe::new(),
    }
}

/// Back to the pool; only an empty pipe may be given back (stale bytes would leak into another
/// tunnel), which the callers guarantee by draining before giving.
fn give_pipe(pipe: Pipe) {
    PIPES.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < MAX_POOLED {
            p.push(pipe);
        }
    });
}

/// Readiness waits on one socket through a glommio stream on a duplicate descriptor, made on
/// the first wait.
struct Waiter {
    fd: RawFd,
    stream: Option<TcpStream>,
}

impl Waiter {
    fn new(fd: RawFd) -> Self {
        Self { fd, stream: None }
    }

    fn stream(&mut self) -> io::Result<&mut TcpStream> {
        if self.stream.is_none() {
            self.stream = Some(sys::glommio_stream_on_dup(self.fd)?);
        }
        self.stream
            .as_mut()
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }

    /// Until the socket has bytes, an end of stream or an error to report.
    async fn readable(&mut self) -> io::Result<()> {
        let mut byte = [0u8; 1];
        self.stream()?.peek(&mut byte).await?;
        Ok(())
    }

    /// Sends one byte, waiting for room in the socket's send buffer.
    async fn send_byte(&mut self, byte: u8) -> io::Result<()> {
        self.stream()?.write_all(&[byte]).await
    }
}

/// Splices `from` → `to` until end of stream on `from` (returns `Ok`; the caller half-closes
/// `to`) or an error. Counts, shapes and marks activity like the copy path.
pub async fn pump(
    from: RawFd,
    to: RawFd,
    meter: &Meter<'_>,
    last_activity: &Cell<Instant>,
) -> io::Result<()> {
    sys::set_nonblocking(from)?;
    sys::set_nonblocking(to)?;
    let mut source = Waiter::new(from);
    let mut sink = Waiter::new(to);
    loop {
        let pipe = take_pipe()?;
        let n = match sys::splice(from, pipe.write.as_raw_fd(), pipe.capacity, false) {
            Ok(0) => {
                give_pipe(pipe);
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                give_pipe(pipe);
                source.readable().await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        last_activity.set(Instant::now());
        meter.shape(n).await;
        // On an error the pipe is dropped (closed) with whatever it still holds.
        drain(&pipe, n, to, &mut sink).await?;
        give_pipe(pipe);
        last_activity.set(Instant::now());
        meter.count(n as u64);
        meter.count_spliced(n as u64);
    }
}

/// Moves all `n` bytes in `pipe` to `to`.
async fn drain(pipe: &Pipe, mut n: usize, to: RawFd, sink: &mut Waiter) -> io::Result<()> {
    while n > 0 {
        match sys::splice(pipe.read.as_raw_fd(), to, n, false) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(sent) => n -= sent,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The socket's send buffer is full: its next byte goes through glommio, which
                // waits for room; the rest follows by splice once it is sent.
                let mut byte = [0u8; 1];
                if sys::read(pipe.read.as_raw_fd(), &mut byte)? != 1 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                sink.send_byte(byte[0]).await?;
                n -= 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
