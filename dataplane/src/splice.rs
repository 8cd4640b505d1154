//! Zero-copy relay of one tunnel direction between two kernel TCP sockets: `splice(2)` moves the
//! bytes socket → pipe → socket inside the kernel (page references, no copy through user space).
//!
//! The splices are non-blocking syscalls (both sockets get `O_NONBLOCK`); the waits are glommio's
//! own io_uring poll on each socket (`poll_readable`/`poll_writable`, added in
//! `vendor/glommio`). io_uring's splice op was not used: the kernel always runs it in an io-wq
//! worker thread (`REQ_F_FORCE_ASYNC`), so every idle tunnel would park a kernel thread in a
//! blocking splice and every chunk would cost a thread hand-off.
//!
//! Pipes come from a per-core pool and are held only while bytes are in them; a direction
//! waiting for data holds none. Pipes are kernel memory (a ring of page references, pages only
//! while data is in flight), not the process's RSS.

use crate::backend_stream::KernelSocket;
use crate::sys;
use crate::tunnel::Meter;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::task::Poll;
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

/// Splices `from` → `to` (their kernel sockets `from_fd`, `to_fd`) until end of stream on
/// `from` (returns `Ok`; the caller half-closes `to`) or an error. Counts, shapes and marks
/// activity like the copy path.
///
/// Both sides overlap: each turn splices what the source has into the pipe's free room and what
/// the pipe holds into the sink, so the source keeps being read while the sink's buffer is full
/// (and the other way round). The task waits only when neither splice moved a byte, and then on
/// whichever of the two can unblock it (socket readiness through glommio's own poll sources).
pub async fn pump<R: KernelSocket, W: KernelSocket>(
    from: &RefCell<R>,
    to: &RefCell<W>,
    (from_fd, to_fd): (RawFd, RawFd),
    meter: &Meter<'_>,
    last_activity: &Cell<Instant>,
) -> io::Result<()> {
    sys::set_nonblocking(from_fd)?;
    sys::set_nonblocking(to_fd)?;
    let mut pipe: Option<Pipe> = None;
    // Bytes in the pipe, not yet in `to`.
    let mut held = 0usize;
    let mut eof = false;
    loop {
        let mut moved = false;
        if !eof {
            let p = match pipe {
                Some(ref p) => p,
                None => pipe.insert(take_pipe()?),
            };
            if held < p.capacity {
                match sys::splice(from_fd, p.write.as_raw_fd(), p.capacity - held, false) {
                    Ok(0) => eof = true,
                    Ok(n) => {
                        held += n;
                        moved = true;
                        last_activity.set(Instant::now());
                        meter.shape(n).await;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // On an error the pipe is dropped (closed) with whatever it still holds.
                    Err(e) => return Err(e),
                }
            }
        }
        if let (Some(p), true) = (&pipe, held > 0) {
            match sys::splice(p.read.as_raw_fd(), to_fd, held, false) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    held -= n;
                    moved = true;
                    last_activity.set(Instant::now());
                    meter.count(n as u64);
                    meter.count_spliced(n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if held == 0 {
            // Empty: back to the pool, so a direction waiting for data holds no pipe.
            if let Some(p) = pipe.take() {
                give_pipe(p);
            }
            if eof {
                return Ok(());
            }
        }
        if moved {
            // A stream that never blocks must still let the core's other tasks run.
            glommio::yield_if_needed().await;
            continue;
        }
        let room = pipe.as_ref().is_none_or(|p| held < p.capacity);
        let want_read = !eof && room;
        let want_write = held > 0;
        poll_fn(|cx| {
            if want_read {
                if let Poll::Ready(r) = from.borrow_mut().poll_ready(cx, false) {
                    return Poll::Ready(r);
                }
            }
            if want_write {
                if let Poll::Ready(r) = to.borrow_mut().poll_ready(cx, true) {
                    return Poll::Ready(r);
                }
            }
            Poll::Pending
        })
        .await?;
    }
}
