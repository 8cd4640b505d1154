//! The resolver's two listeners on one port: UDP (one task per datagram, bounded) and TCP
//! (RFC 7766: many queries per connection, pipelined, answered as they complete, idle
//! connections closed).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::message::Transport;
use crate::resolver::Resolver;
use crate::upstream::tcp::take_frame;

/// UDP queries being resolved at once; more are dropped (the client retries).
const MAX_UDP_INFLIGHT: usize = 1024;
/// TCP client connections at once; more are closed at accept.
const MAX_TCP_CONNECTIONS: usize = 256;
/// Queries outstanding on one TCP connection; reading pauses at this many.
const MAX_PIPELINED: usize = 32;
/// A TCP client connection idle (or a write stalled) this long is closed (RFC 7766 §6.2.3).
const TCP_IDLE: Duration = Duration::from_secs(10);

pub async fn serve_udp(socket: Arc<UdpSocket>, resolver: Arc<Resolver>) {
    let mut tasks = JoinSet::new();
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                // ICMP errors of earlier sends surface here on some kernels; never a reason to stop.
                tracing::debug!(error = %e, "DNS UDP receive failed");
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        while tasks.try_join_next().is_some() {}
        if tasks.len() >= MAX_UDP_INFLIGHT {
            tracing::debug!(%peer, "DNS query dropped: too many in flight");
            continue;
        }
        let query = buf[..n].to_vec();
        let (socket, resolver) = (socket.clone(), resolver.clone());
        tasks.spawn(async move {
            if let Some(answer) = resolver.handle(&query, Transport::Udp).await {
                if let Err(e) = socket.send_to(&answer, peer).await {
                    tracing::debug!(%peer, error = %e, "DNS answer not sent");
                }
            }
        });
    }
}

pub async fn serve_tcp(listener: TcpListener, resolver: Arc<Resolver>) {
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(got) => got,
            Err(e) => {
                // EMFILE and friends: wait a little instead of spinning.
                tracing::warn!(error = %e, "DNS TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        if connections.len() >= MAX_TCP_CONNECTIONS {
            tracing::debug!(%peer, "DNS TCP connection refused: too many open");
            continue;
        }
        connections.spawn(serve_connection(stream, peer, resolver.clone()));
    }
}

async fn serve_connection(stream: TcpStream, peer: SocketAddr, resolver: Arc<Resolver>) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let (answers, mut outgoing) = mpsc::channel::<Vec<u8>>(MAX_PIPELINED);
    let writer = async move {
        while let Some(frame) = outgoing.recv().await {
            match tokio::time::timeout(TCP_IDLE, wr.write_all(&frame)).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
    };
    let reader = async move {
        let mut queries = JoinSet::new();
        let mut buf = Vec::with_capacity(1024);
        'read: loop {
            while let Some(query) = take_frame(&mut buf) {
                while queries.len() >= MAX_PIPELINED {
                    queries.join_next().await;
                }
                let (answers, resolver) = (answers.clone(), resolver.clone());
                queries.spawn(async move {
                    if let Some(answer) = resolver.handle(&query, Transport::Tcp).await {
                        let Ok(len) = u16::try_from(answer.len()) else {
                            return;
                        };
                        let mut frame = Vec::with_capacity(answer.len() + 2);
                        frame.extend_from_slice(&len.to_be_bytes());
                        frame.extend_from_slice(&answer);
                        let _ = answers.send(frame).await;
                    }
                });
            }
            match tokio::time::timeout(TCP_IDLE, rd.read_buf(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => break 'read,
            }
        }
        // Answer what was asked before the client closed (or went idle), then close.
        while queries.join_next().await.is_some() {}
        tracing::trace!(%peer, "DNS TCP connection done");
    };
    tokio::join!(reader, writer);
}
