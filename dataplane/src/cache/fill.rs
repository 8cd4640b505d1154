//! Request coalescing: the first miss for a key becomes the fill's leader and fetches from the
//! origin; later requests for the same key (on any core) follow it — one origin fetch, not N.
//!
//! A disk fill publishes its temporary file and how many body bytes are durably written, so
//! followers stream the body from that file while it grows (a console fleet starting the same
//! multi-gigabyte download together all get bytes at once). Other followers (memory fills, range
//! requests) wait until the fill ends and are then served from the stored entry.
//!
//! The leader holds a [`FillLease`]; dropping it ends the fill and wakes every follower.
//! Followers whose fill produced no entry go to the origin themselves, uncached, rather than
//! electing a new leader (an uncacheable answer would otherwise be fetched N times in a row).

use event_listener::Event;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_proto::cache::entry::EntryMeta;

#[derive(Default)]
pub struct Fills {
    running: Mutex<HashMap<String, Arc<Fill>>>,
}

/// What followers need to stream a disk fill in progress.
#[derive(Debug)]
pub struct Streamable {
    pub meta: EntryMeta,
    /// The temporary file being written (open it before the fill ends: it is renamed then).
    pub temp: PathBuf,
    /// Where the body starts in the file.
    pub body_offset: u64,
}

#[derive(Default)]
struct Progress {
    stream: Option<Arc<Streamable>>,
    /// Body bytes readable from the temporary file.
    available: u64,
    done: bool,
    /// The fill ended with a complete body (`available` is the whole body).
    complete: bool,
}

/// One fill in progress.
#[derive(Default)]
pub struct Fill {
    progress: Mutex<Progress>,
    changed: Event,
}

/// How far a streamed fill got, for a follower at body offset `pos`.
pub enum Advance {
    /// Bytes up to this body offset can be read.
    Readable(u64),
    /// The body is complete and the follower has all of it.
    Complete,
    /// The fill failed; the follower's response cannot be finished.
    Failed,
}

impl Fill {
    fn update(&self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.progress.lock());
        self.changed.notify(usize::MAX);
    }

    /// Waits until the leader ends the fill.
    pub async fn wait(&self) {
        loop {
            let listener = self.changed.listen();
            if self.progress.lock().done {
                return;
            }
            listener.await;
        }
    }

    /// Waits until the fill is streamable (`Some`) or ends without becoming so (`None`).
    pub async fn wait_streamable(&self) -> Option<Arc<Streamable>> {
        loop {
            let listener = self.changed.listen();
            {
                let p = self.progress.lock();
                if let Some(s) = &p.stream {
                    return Some(s.clone());
                }
                if p.done {
                    return None;
                }
            }
            listener.await;
        }
    }

    /// Waits until more than `pos` body bytes are readable, or the fill ends.
    pub async fn wait_beyond(&self, pos: u64) -> Advance {
        loop {
            let listener = self.changed.listen();
            {
                let p = self.progress.lock();
                if p.available > pos {
                    return Advance::Readable(p.available);
                }
                if p.done {
                    return if p.complete {
                        Advance::Complete
                    } else {
                        Advance::Failed
                    };
                }
            }
            listener.await;
        }
    }
}

pub enum Claim {
    Leader(FillLease),
    Follower(Arc<Fill>),
}

/// The leader's hold on a fill; dropping it ends the fill.
pub struct FillLease {
    store: Arc<super::CacheStore>,
    key: String,
    fill: Arc<Fill>,
}

impl FillLease {
    /// Lets followers stream the body from `stream.temp`.
    pub fn publish(&self, stream: Streamable) {
        self.fill.update(|p| p.stream = Some(Arc::new(stream)));
    }

    /// `available` body bytes are durably in the temporary file.
    pub fn advance(&self, available: u64) {
        let moved = self.fill.progress.lock().available < available;
        if moved {
            self.fill
                .update(|p| p.available = p.available.max(available));
        }
    }

    /// The whole body is written and sealed.
    pub fn complete(&self, body_len: u64) {
        self.fill.update(|p| {
            p.available = body_len;
            p.complete = true;
        });
    }
}

impl Drop for FillLease {
    fn drop(&mut self) {
        self.store.fills.running.lock().remove(&self.key);
        self.fill.update(|p| p.done = true);
    }
}

impl Fills {
    pub fn claim(store: &Arc<super::CacheStore>, key: &str) -> Claim {
        let mut running = store.fills.running.lock();
        if let Some(fill) = running.get(key) {
            return Claim::Follower(fill.clone());
        }
        let fill = Arc::new(Fill::default());
        running.insert(key.to_owned(), fill.clone());
        Claim::Leader(FillLease {
            store: store.clone(),
            key: key.to_owned(),
            fill,
        })
    }

    pub fn in_progress(&self) -> usize {
        self.running.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::store::{StorageKind, StoreSettings};
    use switchyard_proto::cache::evict::EvictPolicy;

    fn store() -> Arc<crate::cache::CacheStore> {
        crate::cache::CacheStore::open(StoreSettings {
            kind: StorageKind::Memory,
            memory_max_bytes: 1 << 20,
            memory_max_entries: 100,
            memory_policy: EvictPolicy::Lru,
            disk_dir: std::env::temp_dir(),
            disk_max_bytes: 0,
            memory_threshold: 0,
        })
        .0
    }

    #[test]
    fn one_leader_per_key_and_followers_wake() {
        let store = store();
        let Claim::Leader(lease) = Fills::claim(&store, "k") else {
            panic!("first claim leads")
        };
        let Claim::Follower(fill) = Fills::claim(&store, "k") else {
            panic!("second claim follows")
        };
        assert!(matches!(Fills::claim(&store, "other"), Claim::Leader(_)));
        let waiter = std::thread::spawn(move || futures_lite::future::block_on(fill.wait()));
        drop(lease);
        waiter.join().expect("follower woke");
        assert!(matches!(Fills::claim(&store, "k"), Claim::Leader(_)));
        assert_eq!(store.fills.in_progress(), 0);
    }

    #[test]
    fn followers_see_progress_then_completion_or_failure() {
        let store = store();
        let Claim::Leader(lease) = Fills::claim(&store, "k") else {
            panic!("leads")
        };
        let Claim::Follower(fill) = Fills::claim(&store, "k") else {
            panic!("follows")
        };
        lease.advance(10);
        let at = |pos| futures_lite::future::block_on(fill.wait_beyond(pos));
        assert!(matches!(at(0), Advance::Readable(10)));
        lease.complete(25);
        assert!(matches!(at(10), Advance::Readable(25)));
        drop(lease);
        assert!(matches!(at(25), Advance::Complete));

        let Claim::Leader(lease) = Fills::claim(&store, "j") else {
            panic!("leads")
        };
        let Claim::Follower(fill) = Fills::claim(&store, "j") else {
            panic!("follows")
        };
        lease.advance(5);
        drop(lease);
        assert!(matches!(
            futures_lite::future::block_on(fill.wait_beyond(5)),
            Advance::Failed
        ));
        assert!(futures_lite::future::block_on(fill.wait_streamable()).is_none());
    }
}
