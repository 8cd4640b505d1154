//! One SOCKS5 UDP association inside a WireGuard tunnel as seen by the relay that uses it: a
//! port that sends datagrams to any destination and receives the answers, whose other end is
//! a smoltcp UDP socket on the core that owns the tunnel. Datagrams cross over two bounded
//! channels; when one is full the datagram is dropped, as a full network queue would.

use super::flow::Wake;
use std::net::SocketAddr;
use std::sync::Arc;

/// Datagrams queued per direction; more are dropped.
pub const MAX_QUEUED_DATAGRAMS: usize = 64;

/// The owner's side of an association.
pub(crate) struct DatagramEnds {
    /// Peer → relay: (sender, payload).
    pub to_client: async_channel::Sender<(SocketAddr, Vec<u8>)>,
    /// Relay → peer: (destination, payload); closed when the relay drops its port.
    pub from_client: async_channel::Receiver<(SocketAddr, Vec<u8>)>,
}

/// The relay's side of an association.
pub struct DatagramPort {
    tx: async_channel::Sender<(SocketAddr, Vec<u8>)>,
    rx: async_channel::Receiver<(SocketAddr, Vec<u8>)>,
    owner: Arc<Wake>,
}

impl std::fmt::Debug for DatagramPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatagramPort").finish_non_exhaustive()
    }
}

pub(crate) fn pair(owner: Arc<Wake>) -> (DatagramEnds, DatagramPort) {
    let (to_client, rx) = async_channel::bounded(MAX_QUEUED_DATAGRAMS);
    let (tx, from_client) = async_channel::bounded(MAX_QUEUED_DATAGRAMS);
    (
        DatagramEnds {
            to_client,
            from_client,
        },
        DatagramPort { tx, rx, owner },
    )
}

impl DatagramPort {
    /// Queues `payload` for `to`; false when it was dropped (queue full, or tunnel gone).
    pub fn send(&self, to: SocketAddr, payload: Vec<u8>) -> bool {
        let queued = self.tx.try_send((to, payload)).is_ok();
        self.owner.notify();
        queued
    }

    /// The next datagram from inside the tunnel; None once the tunnel dropped the association.
    pub async fn recv(&self) -> Option<(SocketAddr, Vec<u8>)> {
        self.rx.recv().await.ok()
    }
}

impl Drop for DatagramPort {
    fn drop(&mut self) {
        self.tx.close();
        self.rx.close();
        self.owner.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_a_dropped_port_closes_the_owner_side() {
        let (ends, port) = pair(Arc::new(Wake::default()));
        let to = SocketAddr::from(([10, 0, 0, 1], 53));
        for _ in 0..MAX_QUEUED_DATAGRAMS {
            assert!(port.send(to, vec![1]));
        }
        assert!(!port.send(to, vec![2]), "the queue is bounded");
        drop(port);
        assert!(ends.to_client.is_closed());
        // Queued datagrams are still taken, then the closed channel ends the association.
        let mut taken = 0;
        while ends.from_client.try_recv().is_ok() {
            taken += 1;
        }
        assert_eq!(taken, MAX_QUEUED_DATAGRAMS);
        assert!(ends.from_client.is_closed());
    }
}
