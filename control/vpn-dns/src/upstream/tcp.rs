//! DNS over TCP to one server (RFC 7766): one connection reused for many queries, pipelined
//! (several queries outstanding, answers matched by query id in whatever order they come), and
//! a pool holding one such connection per server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, Query};
use parking_lot::Mutex;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use super::UpstreamError;
use crate::message::{read_reply, upstream_query};

/// An upstream connection with no query outstanding is closed after this long (RFC 7766 §6.2.3:
/// clients should close idle connections; servers do after a few seconds anyway).
const IDLE_CLOSE: Duration = Duration::from_secs(20);
/// Queries waiting to be written on one connection.
const WRITE_QUEUE: usize = 64;

type Pending = Arc<Mutex<HashMap<u16, oneshot::Sender<Vec<u8>>>>>;

/// One pipelined DNS-over-TCP connection. Dropping it closes it.
pub struct Connection {
    frames: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    open: Arc<AtomicBool>,
    tasks: [AbortHandle; 2],
}

impl Drop for Connection {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Marks the connection closed and fails every outstanding query (their senders drop).
fn close(open: &AtomicBool, pending: &Pending) {
    open.store(false, Ordering::Release);
    pending.lock().clear();
}

impl Connection {
    pub fn new(stream: TcpStream) -> Self {
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let (frames, mut queue) = mpsc::channel::<Vec<u8>>(WRITE_QUEUE);
        let pending: Pending = Arc::default();
        let open = Arc::new(AtomicBool::new(true));
        let (p, o) = (pending.clone(), open.clone());
        let writer = tokio::spawn(async move {
            while let Some(frame) = queue.recv().await {
                if wr.write_all(&frame).await.is_err() {
                    break;
                }
            }
            close(&o, &p);
        });
        let (p, o) = (pending.clone(), open.clone());
        let stop_writer = writer.abort_handle();
        let reader = tokio::spawn(async move {
            let mut buf = Vec::with_capacity(4096);
            loop {
                while let Some(frame) = take_frame(&mut buf) {
                    let Some(id) = frame.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
                        continue;
                    };
                    // An answer nobody waits for (timed out, or a stray id) is dropped.
                    if let Some(waiter) = p.lock().remove(&id) {
                        let _ = waiter.send(frame);
                    }
                }
                // read_buf is cancel-safe, so the idle timeout never splits a frame.
                match tokio::time::timeout(IDLE_CLOSE, rd.read_buf(&mut buf)).await {
                    Ok(Ok(0) | Err(_)) => break,
                    Ok(Ok(_)) => {}
                    Err(_idle) if p.lock().is_empty() => break,
                    Err(_idle) => {}
                }
            }
            close(&o, &p);
            // Dropping the write half as well closes the socket now, not when the pool
            // replaces this connection.
            stop_writer.abort();
        });
        Connection {
            frames,
            pending,
            open,
            tasks: [writer.abort_handle(), reader.abort_handle()],
        }
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Sends `query` with a fresh id and waits for its answer (no timeout here: the caller
    /// bounds the whole attempt).
    pub async fn exchange(&self, query: &Query) -> Result<Message, UpstreamError> {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut pending = self.pending.lock();
            if !self.is_open() {
                return Err(UpstreamError::Closed);
            }
            let mut rng = rand::thread_rng();
            let Some(id) = (0..64)
                .map(|_| rng.gen::<u16>())
                .find(|id| !pending.contains_key(id))
            else {
                return Err(UpstreamError::Busy);
            };
            pending.insert(id, tx);
            id
        };
        // Removes the id if this future is dropped (timeout) before the answer came.
        let _forget = ForgetOnDrop {
            pending: &self.pending,
            id,
        };
        let bytes = upstream_query(id, query)
            .to_vec()
            .map_err(|e| UpstreamError::Encode(e.to_string()))?;
        let len =
            u16::try_from(bytes.len()).map_err(|_| UpstreamError::Encode("too long".into()))?;
        let mut frame = Vec::with_capacity(bytes.len() + 2);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&bytes);
        self.frames
            .send(frame)
            .await
            .map_err(|_| UpstreamError::Closed)?;
        let answer = rx.await.map_err(|_| UpstreamError::Closed)?;
        Ok(read_reply(&answer, id, query)?)
    }
}

/// Removes and returns the first complete length-prefixed frame of `buf`.
pub(crate) fn take_frame(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let [hi, lo, ..] = buf[..] else { return None };
    let end = 2 + usize::from(u16::from_be_bytes([hi, lo]));
    if buf.len() < end {
        return None;
    }
    let frame = buf[2..end].to_vec();
    buf.drain(..end);
    Some(frame)
}

struct ForgetOnDrop<'a> {
    pending: &'a Pending,
    id: u16,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        self.pending.lock().remove(&self.id);
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Connection>>>>;

/// One reusable connection per server.
#[derive(Default)]
pub struct Pool {
    slots: Mutex<HashMap<SocketAddr, Slot>>,
}

impl Pool {
    /// Sends `query` to `server` on its pooled connection, opening one with `open` when there is
    /// none. A reused connection that closes before answering (the server dropped it while
    /// idle) is replaced once.
    pub async fn exchange<F, Fut>(
        &self,
        server: SocketAddr,
        query: &Query,
        open: F,
    ) -> Result<Message, UpstreamError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<TcpStream, UpstreamError>>,
    {
        let slot = self.slots.lock().entry(server).or_default().clone();
        let (conn, fresh) = connection(&slot, &open).await?;
        match conn.exchange(query).await {
            Err(UpstreamError::Closed) if !fresh => {
                let (conn, _) = connection(&slot, &open).await?;
                conn.exchange(query).await
            }
            other => other,
        }
    }
}

/// The slot's open connection, or a new one (`true` when new).
async fn connection<F, Fut>(slot: &Slot, open: &F) -> Result<(Arc<Connection>, bool), UpstreamError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<TcpStream, UpstreamError>>,
{
    let mut slot = slot.lock().await;
    if let Some(conn) = slot.as_ref().filter(|c| c.is_open()) {
        return Ok((conn.clone(), false));
    }
    let conn = Arc::new(Connection::new(open().await?));
    *slot = Some(conn.clone());
    Ok((conn, true))
}

#[cfg(test)]
mod tests {
    use super::take_frame;

    #[test]
    fn frames_are_taken_whole_and_in_order() {
        let mut buf = vec![0, 3, b'a', b'b'];
        assert_eq!(take_frame(&mut buf), None, "incomplete");
        buf.extend_from_slice(&[b'c', 0, 0, 0]);
        assert_eq!(take_frame(&mut buf).as_deref(), Some(&b"abc"[..]));
        assert_eq!(take_frame(&mut buf).as_deref(), Some(&b""[..]));
        assert_eq!(take_frame(&mut buf), None);
        assert_eq!(buf, [0]);
    }
}
