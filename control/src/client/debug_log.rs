//! The debug-entry ring of `GET /api/v1/debug/entries`: the engine's request records, moved off
//! the data plane's bounded queue by the control plane (a core never waits on this ring's lock),
//! kept newest last, oldest dropped past the capacity.

use super::engine_config::action_of;
use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use std::collections::VecDeque;
use switchyard_api::client::DebugEntry;
use switchyard_dataplane::events::RequestRecord;

/// Entries kept.
pub const CAPACITY: usize = 1000;

pub struct DebugLog {
    ring: Mutex<VecDeque<DebugEntry>>,
    capacity: usize,
}

impl DebugLog {
    pub fn new(capacity: usize) -> Self {
        Self {
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(64))),
            capacity: capacity.max(1),
        }
    }

    pub fn push(&self, entry: DebugEntry) {
        let mut ring = self.ring.lock();
        if ring.len() == self.capacity {
            ring.pop_front();
        }
        ring.push_back(entry);
    }

    pub fn len(&self) -> usize {
        self.ring.lock().len()
    }

    pub fn all(&self) -> Vec<DebugEntry> {
        self.ring.lock().iter().cloned().collect()
    }

    /// The `count` most recent entries, oldest first.
    pub fn last(&self, count: usize) -> Vec<DebugEntry> {
        let ring = self.ring.lock();
        ring.iter()
            .skip(ring.len().saturating_sub(count))
            .cloned()
            .collect()
    }

    pub fn errors(&self) -> Vec<DebugEntry> {
        self.ring
            .lock()
            .iter()
            .filter(|e| !e.error.is_empty())
            .cloned()
            .collect()
    }

    pub fn clear(&self) {
        self.ring.lock().clear();
    }
}

/// A request record as a debug entry (`action` and `backend` from the engine backend's name).
pub fn entry_from(record: &RequestRecord) -> DebugEntry {
    let (action, backend) = action_of(&record.backend);
    DebugEntry {
        timestamp: DateTime::<Utc>::from(record.timestamp),
        method: record.method.clone(),
        host: record.host.clone(),
        path: record.path.clone(),
        status_code: record.status_code,
        duration: switchyard_config::Duration::from_millis(record.duration_ms).to_string(),
        action: action.to_owned(),
        backend: backend.to_owned(),
        bytes_sent: record.bytes_sent,
        bytes_recv: record.bytes_recv,
        error: record.error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_dataplane::events::Protocol;

    fn record(backend: &str, error: &str) -> RequestRecord {
        RequestRecord {
            timestamp: std::time::SystemTime::now(),
            method: "GET".into(),
            host: "example.org".into(),
            path: "/".into(),
            url: "http://example.org/".into(),
            user_agent: String::new(),
            client_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            username: String::new(),
            backend: backend.into(),
            status_code: if error.is_empty() { 200 } else { 502 },
            bytes_sent: 10,
            bytes_recv: 5,
            duration_ms: 1500,
            error: error.into(),
            protocol: Protocol::Http,
        }
    }

    #[test]
    fn ring_keeps_the_newest_and_filters_errors() {
        let log = DebugLog::new(3);
        for i in 0..5 {
            let err = if i % 2 == 0 { "" } else { "connection refused" };
            log.push(entry_from(&record("server/home", err)));
        }
        assert_eq!(log.len(), 3);
        assert_eq!(log.errors().len(), 1);
        assert_eq!(log.last(2).len(), 2);
        assert_eq!(log.last(10).len(), 3);
        let e = &log.all()[0];
        assert_eq!((e.action.as_str(), e.backend.as_str()), ("server", "home"));
        assert_eq!(e.duration, "1.5s");
        log.clear();
        assert_eq!(log.len(), 0);
    }
}
