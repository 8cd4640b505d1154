//! Plain DNS over UDP to one server from a fresh socket per query (a random source port and a
//! random id each time, RFC 5452), optionally carrying an SO_MARK for policy routing.

use std::net::SocketAddr;

use hickory_proto::op::{Message, Query};
use rand::Rng;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

use super::UpstreamError;
use crate::message::{read_reply, upstream_query};

/// Largest reply read (the EDNS size we advertise is smaller; a bigger datagram is not ours).
const MAX_REPLY: usize = 4096;

/// A UDP socket for talking to `server`, marked with `mark` when given (needs CAP_NET_ADMIN).
pub fn socket(server: SocketAddr, mark: Option<u32>) -> Result<UdpSocket, UpstreamError> {
    let socket = Socket::new(
        Domain::for_address(server),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    socket.set_nonblocking(true)?;
    Ok(UdpSocket::from_std(socket.into())?)
}

/// Sends `query` to `server` and returns the first datagram that answers it; datagrams from
/// elsewhere (the socket is connected) or with another id or question are ignored. No timeout
/// here: the caller bounds the attempt.
pub async fn exchange(
    server: SocketAddr,
    mark: Option<u32>,
    query: &Query,
) -> Result<Message, UpstreamError> {
    let socket = socket(server, mark)?;
    socket.connect(server).await?;
    let id = rand::thread_rng().gen::<u16>();
    let bytes = upstream_query(id, query)
        .to_vec()
        .map_err(|e| UpstreamError::Encode(e.to_string()))?;
    socket.send(&bytes).await?;
    let mut buf = vec![0u8; MAX_REPLY];
    loop {
        let n = socket.recv(&mut buf).await?;
        match read_reply(&buf[..n], id, query) {
            Ok(reply) => return Ok(reply),
            Err(e) => tracing::debug!(%server, error = %e, "ignored an upstream datagram"),
        }
    }
}
