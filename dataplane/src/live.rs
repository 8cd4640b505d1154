//! Live proxied connections, readable by the control plane (`GET /api/v1/connections`).
//!
//! A core never waits for the control plane here. Each core has its own table: a map behind a
//! mutex plus a lock-free queue of changes (opened / closed). The core pushes each change into
//! its queue and then only *tries* the lock to apply what is queued; if the control plane holds
//! it (copying the list for an API call), the changes stay queued and the next change or the next
//! reader applies them. Readers take the lock normally, apply the queue, then copy the entries.
//! Byte counts are atomics in the shared entry, so the relay never locks at all.

use crate::events::Protocol;
use crossbeam_queue::SegQueue;
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

enum Change {
    Opened(Arc<LiveConnection>),
    Closed(u64),
}

#[derive(Default)]
struct CoreTable {
    /// Ids are numbered per core; only that core's thread increments this.
    next: AtomicU64,
    changes: SegQueue<Change>,
    entries: Mutex<HashMap<u64, Arc<LiveConnection>>>,
}

impl CoreTable {
    fn apply(changes: &SegQueue<Change>, entries: &mut HashMap<u64, Arc<LiveConnection>>) {
        while let Some(change) = changes.pop() {
            match change {
                Change::Opened(conn) => {
                    entries.insert(conn.id, conn);
                }
                Change::Closed(id) => {
                    entries.remove(&id);
                }
            }
        }
    }

    /// The core's side: queue the change, apply the queue if the lock is free right now.
    fn push(&self, change: Change) {
        self.changes.push(change);
        if let Some(mut entries) = self.entries.try_lock() {
            Self::apply(&self.changes, &mut entries);
        }
    }

    /// A reader's side: wait for the lock, bring the map up to date, read it.
    fn read<R>(&self, f: impl FnOnce(&HashMap<u64, Arc<LiveConnection>>) -> R) -> R {
        let mut entries = self.entries.lock();
        Self::apply(&self.changes, &mut entries);
        f(&entries)
    }
}

pub struct LiveTable {
    cores: Box<[CachePadded<CoreTable>]>,
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
            t.push(Change::Closed(self.conn.id));
        }
    }
}

impl LiveTable {
    pub fn new(cores: usize) -> Self {
        Self {
            cores: (0..cores.max(1))
                .map(|_| CachePadded::new(CoreTable::default()))
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
        let table = &self.cores[core];
        let n = table.next.fetch_add(1, Relaxed) + 1;
        // Ids are unique across cores: the core number in the top bits.
        let id = ((core as u64) << 48) | (n & ((1 << 48) - 1));
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
        table.push(Change::Opened(conn.clone()));
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
            .flat_map(|c| c.read(|entries| entries.values().cloned().collect::<Vec<_>>()))
            .collect();
        all.sort_by_key(|c| (c.started, c.id));
        all
    }

    pub fn len(&self) -> usize {
        self.cores.iter().map(|c| c.read(HashMap::len)).sum()
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

    #[test]
    fn a_core_never_waits_for_a_reader_and_nothing_is_lost() {
        let t = LiveTable::new(1);
        let client: SocketAddr = "127.0.0.1:5000".parse().expect("addr");
        let a = t.register(0, client, "a:80".into(), "direct".into(), Protocol::Http);
        // A reader holds core 0's lock (as an API copy would) while the core opens and closes.
        let held = t.cores[0].entries.lock();
        let b = t.register(0, client, "b:80".into(), "direct".into(), Protocol::Http);
        drop(a);
        assert_eq!(held.len(), 1, "the changes wait in the queue");
        drop(held);
        let list = t.list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].id, b.conn.id);
        drop(b);
        assert!(t.is_empty());
    }
}
