//! The request log: a ring buffer of the last `api.request_log_size` requests the data plane
//! reported, with running totals that survive eviction (reset only by `DELETE /api/v1/requests`).

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use switchyard_api::{HostCount, RequestLogEntry, RequestLogStats};
use switchyard_dataplane::events::RequestRecord;

#[derive(Default)]
struct Inner {
    capacity: usize,
    next_id: u64,
    entries: VecDeque<RequestLogEntry>,
    total_requests: u64,
    total_bytes_sent: u64,
    total_bytes_recv: u64,
    by_method: BTreeMap<String, u64>,
    by_status: BTreeMap<String, u64>,
    by_host: HashMap<String, u64>,
}

/// Hosts tracked for `top_hosts`; beyond this many the rarest are forgotten.
const MAX_TRACKED_HOSTS: usize = 10_000;

pub struct RequestLog {
    inner: Mutex<Inner>,
}

pub struct Page {
    pub limit: usize,
    pub offset: usize,
    /// Only entries with an id greater than this.
    pub since: Option<u64>,
}

impl RequestLog {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                capacity: capacity.max(1),
                ..Inner::default()
            }),
        }
    }

    pub fn set_capacity(&self, capacity: usize) {
        let mut i = self.inner.lock();
        i.capacity = capacity.max(1);
        while i.entries.len() > i.capacity {
            i.entries.pop_front();
        }
    }

    pub fn push(&self, r: RequestRecord) {
        let mut i = self.inner.lock();
        i.next_id += 1;
        let id = i.next_id;
        i.total_requests += 1;
        i.total_bytes_sent += r.bytes_sent;
        i.total_bytes_recv += r.bytes_recv;
        *i.by_method.entry(r.method.clone()).or_default() += 1;
        *i.by_status.entry(r.status_code.to_string()).or_default() += 1;
        let host = r
            .host
            .rsplit_once(':')
            .map_or(r.host.as_str(), |(h, _)| h)
            .trim_matches(['[', ']'])
            .to_owned();
        if i.by_host.len() >= MAX_TRACKED_HOSTS && !i.by_host.contains_key(&host) {
            // Forget the hosts seen once so a scan of many names cannot grow this without bound.
            i.by_host.retain(|_, c| *c > 1);
        }
        *i.by_host.entry(host).or_default() += 1;
        let entry = RequestLogEntry {
            id,
            timestamp: DateTime::<Utc>::from(r.timestamp),
            method: r.method,
            host: r.host,
            path: r.path,
            url: r.url,
            user_agent: r.user_agent,
            client_ip: r.client_ip.to_string(),
            username: r.username,
            backend: r.backend,
            status_code: r.status_code,
            bytes_sent: r.bytes_sent,
            bytes_recv: r.bytes_recv,
            duration_ms: r.duration_ms,
            error: r.error,
            protocol: r.protocol.as_str().to_owned(),
        };
        if i.entries.len() >= i.capacity {
            i.entries.pop_front();
        }
        i.entries.push_back(entry);
    }

    /// Newest first.
    pub fn page(&self, page: &Page) -> Vec<RequestLogEntry> {
        let i = self.inner.lock();
        i.entries
            .iter()
            .rev()
            .filter(|e| page.since.is_none_or(|s| e.id > s))
            .skip(page.offset)
            .take(page.limit)
            .cloned()
            .collect()
    }

    pub fn stats(&self, enabled: bool) -> RequestLogStats {
        let i = self.inner.lock();
        let mut hosts: Vec<HostCount> = i
            .by_host
            .iter()
            .map(|(host, count)| HostCount {
                host: host.clone(),
                count: *count,
            })
            .collect();
        hosts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.host.cmp(&b.host)));
        hosts.truncate(10);
        RequestLogStats {
            enabled,
            count: i.entries.len() as u64,
            max_size: i.capacity as u64,
            total_requests: i.total_requests,
            total_bytes_sent: i.total_bytes_sent,
            total_bytes_recv: i.total_bytes_recv,
            requests_by_method: i.by_method.clone(),
            requests_by_status: i.by_status.clone(),
            top_hosts: hosts,
        }
    }

    /// Empties the log and resets every total.
    pub fn clear(&self) {
        let mut i = self.inner.lock();
        let capacity = i.capacity;
        let next_id = i.next_id;
        *i = Inner {
            capacity,
            next_id,
            ..Inner::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_dataplane::events::Protocol;

    fn record(host: &str, method: &str, status: u16) -> RequestRecord {
        RequestRecord {
            timestamp: std::time::SystemTime::now(),
            method: method.into(),
            host: host.into(),
            path: "/".into(),
            url: format!("http://{host}/"),
            user_agent: "t".into(),
            client_ip: "127.0.0.1".parse().expect("ip"),
            username: String::new(),
            backend: "direct".into(),
            status_code: status,
            bytes_sent: 10,
            bytes_recv: 1,
            duration_ms: 2,
            error: String::new(),
            protocol: Protocol::Http,
        }
    }

    #[test]
    fn ring_totals_top_hosts_and_clear() {
        let log = RequestLog::new(3);
        for n in 0..12 {
            log.push(record(
                &format!("h{}.test:80", n % 4),
                if n % 2 == 0 { "GET" } else { "POST" },
                200,
            ));
        }
        log.push(record("h0.test:80", "GET", 404));
        let s = log.stats(true);
        assert_eq!(s.count, 3);
        assert_eq!(s.total_requests, 13);
        assert_eq!(s.total_bytes_sent, 130);
        assert_eq!(s.requests_by_method["GET"], 7);
        assert_eq!(s.requests_by_status["404"], 1);
        assert_eq!(
            s.top_hosts[0],
            HostCount {
                host: "h0.test".into(),
                count: 4
            }
        );
        assert!(s.top_hosts.windows(2).all(|w| w[0].count >= w[1].count));
        let page = log.page(&Page {
            limit: 2,
            offset: 0,
            since: None,
        });
        assert_eq!(page.len(), 2);
        assert_eq!(page[0].id, 13);
        let since = log.page(&Page {
            limit: 100,
            offset: 0,
            since: Some(12),
        });
        assert_eq!(since.len(), 1);
        log.clear();
        let s = log.stats(true);
        assert_eq!((s.count, s.total_requests, s.top_hosts.len()), (0, 0, 0));
        log.push(record("x:1", "GET", 200));
        assert_eq!(
            log.page(&Page {
                limit: 1,
                offset: 0,
                since: None
            })[0]
                .id,
            14,
            "ids never repeat"
        );
    }
}
