//! Live proxied connections, readable by the control plane (`GET /api/v1/connections`). Each
//! core has its own table behind its own lock: the core takes it only to insert and remove (so it
//! is uncontended except while an API read copies the list), and byte counts are atomics in the
//! shared entry so the relay never locks.

use crate::events::Protocol;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

#[derive(Debug)]
pub struct LiveConnection {
    pub id: u64,
    pub client: SocketAddr,
    /// `host:port` of the destination.
    pub host: String,
    pub backend: String,
    pub protocol: Protocol,
    pub started: SystemTime,
    /// Towards the client.
    pub bytes_sent: AtomicU64,
    /// From the client.
    pub bytes_recv: AtomicU64,
}

impl LiveConnection {
    pub fn add_sent(&self, n: u64) {
        self.bytes_sent.fetch_add(n, Relaxed);
    }
    pub fn add_recv(&self, n: u64) {
        self.bytes_recv.fetch_add(n, Relaxed);
    }
}

#[derive(Default)]
struct CoreTable {
    next: u64,
    entries: HashMap<u64, Arc<LiveConnection>>,
}

pub struct LiveTable {
    cores: Box<[CachePadded<Mutex<CoreTable>>]>,
}

/// Removes the entry when the connection ends.
pub struct LiveGuard<'a> {
    table: &'a LiveTable,
    core: usize,
    pub conn: Arc<LiveConnection>,
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.table.cores.get(self.core) {
            t.lock().entries.remove(&self.conn.id);
        }
    }
}

impl LiveTable {
    pub fn new(cores: usize) -> Self {
        Self {
            cores: (0..cores.max(1))
                .map(|_| CachePadded::new(Mutex::new(CoreTable::default())))
                .collect(),
        }
    }

    pub fn register(
        &self,
        core: usize,
        client: SocketAddr,
        host: String,
        backend: String,
        protocol: Protocol,
    ) -> LiveGuard<'_> {
        let core = core.min(self.cores.len() - 1);
        let mut t = self.cores[core].lock();
        t.next += 1;
        // Ids are unique across cores: the core number in the top bits.
        let id = ((core as u64) << 48) | (t.next & ((1 << 48) - 1));
        let conn = Arc::new(LiveConnection {
            id,
            client,
            host,
            backend,
            protocol,
            started: SystemTime::now(),
            bytes_sent: AtomicU64::new(0),
            bytes_recv: AtomicU64::new(0),
        });
        t.entries.insert(id, conn.clone());
        drop(t);
        LiveGuard {
            table: self,
            core,
            conn,
        }
    }

    /// A copy of every live entry, oldest first.
    pub fn list(&self) -> Vec<Arc<LiveConnection>> {
        let mut all: Vec<Arc<LiveConnection>> = self
            .cores
            .iter()
            .flat_map(|c| c.lock().entries.values().cloned().collect::<Vec<_>>())
            .collect();
        all.sort_by_key(|c| (c.started, c.id));
        all
    }

    pub fn len(&self) -> usize {
        self.cores.iter().map(|c| c.lock().entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_list_and_remove() {
        let t = LiveTable::new(2);
        let client: SocketAddr = "127.0.0.1:5000".parse().expect("addr");
        let a = t.register(0, client, "a:80".into(), "direct".into(), Protocol::Http);
        let b = t.register(
            1,
            client,
            "b:443".into(),
            "direct".into(),
            Protocol::Connect,
        );
        assert_ne!(a.conn.id, b.conn.id);
        b.conn.add_sent(10);
        let list = t.list();
        assert_eq!(list.len(), 2);
        assert_eq!(
            list.iter().map(|c| c.bytes_sent.load(Relaxed)).sum::<u64>(),
            10
        );
        drop(a);
        assert_eq!(t.len(), 1);
        drop(b);
        assert!(t.is_empty());
    }
}
