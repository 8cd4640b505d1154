//! The retained log: a bounded ring of the newest entries, paged newest first with a minimum
//! level. Writers (the tracing layer, on any thread, data-plane cores included) only push into a
//! lock-free queue; the mutex around the ordered ring is taken by readers alone, so a logging
//! thread never waits on a lock an API request holds.

use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use switchyard_api::diagnostics::{LogEntry, LogLevel, LogPage};

/// What `GET /api/v1/logs` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageQuery {
    pub limit: usize,
    pub offset: usize,
    /// Minimum level: `warn` returns warn and error entries.
    pub min_level: Option<LogLevel>,
}

impl Default for PageQuery {
    fn default() -> Self {
        Self {
            limit: 100,
            offset: 0,
            min_level: None,
        }
    }
}

pub struct LogRing {
    /// Entries pushed since the last read, oldest first; when full the oldest is overwritten.
    pending: ArrayQueue<Arc<LogEntry>>,
    /// The newest `capacity` entries, oldest first. Locked by readers only.
    retained: Mutex<VecDeque<Arc<LogEntry>>>,
    capacity: usize,
}

impl LogRing {
    /// A ring keeping the newest `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            pending: ArrayQueue::new(capacity),
            retained: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Never blocks: a lock-free push that drops the oldest pending entry when full.
    pub fn push(&self, entry: Arc<LogEntry>) {
        self.pending.force_push(entry);
    }

    /// Moves pending entries into the ordered ring; the caller holds the ring's lock.
    fn settle(&self, retained: &mut VecDeque<Arc<LogEntry>>) {
        while let Some(e) = self.pending.pop() {
            if retained.len() == self.capacity {
                retained.pop_front();
            }
            retained.push_back(e);
        }
    }

    /// One page, newest first; `total` counts every retained entry that passes the filter.
    pub fn page(&self, q: &PageQuery) -> LogPage {
        let mut retained = self.retained.lock();
        self.settle(&mut retained);
        let mut total = 0u64;
        let mut entries = Vec::with_capacity(q.limit.min(retained.len()));
        for e in retained.iter().rev() {
            if q.min_level.is_some_and(|min| e.level < min) {
                continue;
            }
            if total >= q.offset as u64 && entries.len() < q.limit {
                entries.push(LogEntry::clone(e));
            }
            total += 1;
        }
        LogPage {
            entries,
            total,
            limit: q.limit as u64,
            offset: q.offset as u64,
        }
    }

    /// Entries currently retained.
    pub fn len(&self) -> usize {
        let mut retained = self.retained.lock();
        self.settle(&mut retained);
        retained.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn entry(n: usize, level: LogLevel) -> Arc<LogEntry> {
        Arc::new(LogEntry {
            timestamp: Utc::now(),
            level,
            message: format!("m{n}"),
            fields: Default::default(),
        })
    }

    fn messages(p: &LogPage) -> Vec<&str> {
        p.entries.iter().map(|e| e.message.as_str()).collect()
    }

    #[test]
    fn keeps_the_newest_capacity_entries_newest_first() {
        let ring = LogRing::new(3);
        for n in 0..5 {
            ring.push(entry(n, LogLevel::Info));
        }
        let p = ring.page(&PageQuery::default());
        assert_eq!(messages(&p), ["m4", "m3", "m2"]);
        assert_eq!(p.total, 3);
        // Older entries already settled into the ring are evicted as new ones arrive.
        for n in 5..7 {
            ring.push(entry(n, LogLevel::Info));
        }
        assert_eq!(
            messages(&ring.page(&PageQuery::default())),
            ["m6", "m5", "m4"]
        );
        assert_eq!(ring.len(), 3);
    }

    #[test]
    fn pages_with_limit_and_offset() {
        let ring = LogRing::new(10);
        for n in 0..10 {
            ring.push(entry(n, LogLevel::Info));
        }
        let q = PageQuery {
            limit: 3,
            offset: 2,
            min_level: None,
        };
        let p = ring.page(&q);
        assert_eq!(messages(&p), ["m7", "m6", "m5"]);
        assert_eq!((p.total, p.limit, p.offset), (10, 3, 2));
        let past_end = ring.page(&PageQuery {
            limit: 5,
            offset: 20,
            min_level: None,
        });
        assert!(past_end.entries.is_empty());
        assert_eq!(past_end.total, 10);
    }

    #[test]
    fn level_is_a_minimum() {
        let ring = LogRing::new(10);
        let levels = [
            LogLevel::Debug,
            LogLevel::Info,
            LogLevel::Warn,
            LogLevel::Error,
            LogLevel::Info,
            LogLevel::Warn,
        ];
        for (n, l) in levels.into_iter().enumerate() {
            ring.push(entry(n, l));
        }
        let warn = ring.page(&PageQuery {
            min_level: Some(LogLevel::Warn),
            ..PageQuery::default()
        });
        assert_eq!(messages(&warn), ["m5", "m3", "m2"]);
        assert_eq!(warn.total, 3);
        let offset = ring.page(&PageQuery {
            limit: 1,
            offset: 1,
            min_level: Some(LogLevel::Warn),
        });
        assert_eq!(messages(&offset), ["m3"]);
        assert_eq!(offset.total, 3);
        let debug = ring.page(&PageQuery {
            min_level: Some(LogLevel::Debug),
            ..PageQuery::default()
        });
        assert_eq!(debug.total, 6);
    }

    #[test]
    fn concurrent_writers_never_exceed_capacity() {
        let ring = Arc::new(LogRing::new(50));
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for n in 0..1000 {
                        ring.push(entry(t * 1000 + n, LogLevel::Info));
                    }
                })
            })
            .collect();
        for _ in 0..20 {
            assert!(ring.len() <= 50);
        }
        for w in writers {
            w.join().expect("writer thread");
        }
        assert_eq!(ring.len(), 50);
    }
}
