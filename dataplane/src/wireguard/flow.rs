//! One proxied TCP flow inside a WireGuard tunnel as seen by the connection that uses it: a byte
//! stream (`AsyncRead` + `AsyncWrite`) whose other end is a smoltcp socket on the core that owns
//! the tunnel. Bytes cross in chunks over two unbounded channels whose depth is capped by hand
//! ([`MAX_QUEUED_CHUNKS`]), so a slow side pushes back on the other through the TCP window
//! instead of buffering without limit. Works the same whether the owner is this core or another.

use event_listener::{Event, EventListener};
use futures::Stream;
use futures_lite::io::{AsyncRead, AsyncWrite};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Largest chunk moved in one message.
pub const CHUNK: usize = 64 * 1024;
/// Chunks queued per direction before the producer waits.
pub const MAX_QUEUED_CHUNKS: usize = 4;

/// Wakes the owner core's tunnel loop from any thread.
#[derive(Debug, Default)]
pub struct Wake {
    dirty: AtomicBool,
    event: Event,
}

impl Wake {
    pub fn notify(&self) {
        self.dirty.store(true, Ordering::Release);
        self.event.notify(1);
    }

    /// Whether work was signalled since the last call (and clears the flag).
    pub fn take(&self) -> bool {
        self.dirty.swap(false, Ordering::AcqRel)
    }

    pub fn listen(&self) -> EventListener {
        self.event.listen()
    }
}

/// The owner's side of a flow (a tunnel's owner core, or a QUIC endpoint's).
pub(crate) struct FlowEnds {
    /// Peer → client chunks.
    pub to_client: async_channel::Sender<Vec<u8>>,
    /// Client → peer chunks; closed by the client when it has nothing more to send.
    pub from_client: async_channel::Receiver<Vec<u8>>,
    /// Signalled when the owner took a chunk from `from_client`.
    pub space: Arc<Event>,
    /// Set before the channels close when the flow was cut (reset, connection lost) rather
    /// than ended: the connection's reads then fail instead of seeing an orderly end.
    pub aborted: Arc<AtomicBool>,
}

/// The connection's side of a flow.
pub struct FlowStream {
    // Boxed: a receiver is not Unpin, and the relays want Unpin streams.
    rx: Pin<Box<async_channel::Receiver<Vec<u8>>>>,
    tx: async_channel::Sender<Vec<u8>>,
    space: Arc<Event>,
    space_wait: Option<EventListener>,
    owner: Arc<Wake>,
    reading: Option<(Vec<u8>, usize)>,
    local: SocketAddr,
    aborted: Arc<AtomicBool>,
}

impl std::fmt::Debug for FlowStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowStream")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

pub(crate) fn pair(owner: Arc<Wake>, local: SocketAddr) -> (FlowEnds, FlowStream) {
    let (to_client, rx) = async_channel::unbounded();
    let (tx, from_client) = async_channel::unbounded();
    let space = Arc::new(Event::new());
    let aborted = Arc::new(AtomicBool::new(false));
    (
        FlowEnds {
            to_client,
            from_client,
            space: space.clone(),
            aborted: aborted.clone(),
        },
        FlowStream {
            rx: Box::pin(rx),
            tx,
            space,
            space_wait: None,
            owner,
            reading: None,
            local,
            aborted,
        },
    )
}

impl FlowStream {
    /// The tunnel address and port the flow leaves from.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Ends the client → peer direction (the peer gets a FIN once queued bytes are sent).
    pub fn shutdown_write(&self) {
        self.tx.close();
        self.owner.notify();
    }

    /// For a pooled idle flow: the peer has neither closed it nor sent stray bytes.
    pub fn idle_is_clean(&self) -> bool {
        self.rx.is_empty() && !self.rx.is_closed() && self.reading.is_none()
    }
}

impl AsyncRead for FlowStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            if let Some((chunk, offset)) = &mut self.reading {
                let n = (chunk.len() - *offset).min(buf.len());
                buf[..n].copy_from_slice(&chunk[*offset..*offset + n]);
                *offset += n;
                if *offset == chunk.len() {
                    self.reading = None;
                }
                return Poll::Ready(Ok(n));
            }
            match self.rx.as_mut().poll_next(cx) {
                Poll::Ready(Some(chunk)) => {
                    // The owner may have stopped reading its socket while our queue was full.
                    self.owner.notify();
                    if !chunk.is_empty() {
                        self.reading = Some((chunk, 0));
                    }
                }
                Poll::Ready(None) if self.aborted.load(Ordering::Acquire) => {
                    return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()))
                }
                Poll::Ready(None) => return Poll::Ready(Ok(0)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for FlowStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.tx.is_closed() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        while self.tx.len() >= MAX_QUEUED_CHUNKS {
            // Listen first, then check again: a chunk taken in between still wakes us.
            if self.space_wait.is_none() {
                let listener = self.space.listen();
                self.space_wait = Some(listener);
                continue;
            }
            let Some(wait) = self.space_wait.as_mut() else {
                break;
            };
            match Pin::new(wait).poll(cx) {
                Poll::Ready(()) => self.space_wait = None,
                Poll::Pending => return Poll::Pending,
            }
        }
        self.space_wait = None;
        let n = buf.len().min(CHUNK);
        if self.tx.try_send(buf[..n].to_vec()).is_err() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.owner.notify();
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shutdown_write();
        Poll::Ready(Ok(()))
    }
}

impl Drop for FlowStream {
    fn drop(&mut self) {
        // Both channels close with us; the owner sees that and aborts the socket if it is open.
        self.rx.close();
        self.tx.close();
        self.owner.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::io::AsyncReadExt;

    #[test]
    fn a_cut_flow_fails_its_reads_and_an_ended_one_reads_eof() {
        let (ends, mut ended) = pair(Arc::new(Wake::default()), ([127, 0, 0, 1], 1).into());
        let _ = ends.to_client.try_send(b"last".to_vec());
        ends.to_client.close();
        let mut buf = [0u8; 8];
        let read = |s: &mut FlowStream, b: &mut [u8]| futures::executor::block_on(s.read(b));
        assert_eq!(read(&mut ended, &mut buf).expect("data"), 4);
        assert_eq!(read(&mut ended, &mut buf).expect("eof"), 0);

        let (ends, mut cut) = pair(Arc::new(Wake::default()), ([127, 0, 0, 1], 1).into());
        let _ = ends.to_client.try_send(b"part".to_vec());
        ends.aborted.store(true, Ordering::Release);
        drop(ends);
        assert_eq!(
            read(&mut cut, &mut buf).expect("queued bytes still read"),
            4
        );
        let err = read(&mut cut, &mut buf).expect_err("cut");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    }
}
