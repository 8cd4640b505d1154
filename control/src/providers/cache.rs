//! The in-memory server-list cache: one list per provider API, kept for [`LIST_TTL`] and
//! refetched when it expires or on request. A failed fetch records its error and keeps the
//! last good list. Time is passed in, so the expiry policy is tested without waiting.

use super::select::Server;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::provider::ProviderKind;

/// How long a fetched server list is used before it is fetched again (the spec's 6 hours).
pub const LIST_TTL: Duration = Duration::from_secs(6 * 3600);

/// Which list: the provider and the API base it came from (two backends of one provider with
/// different `api_url`s have separate lists).
pub type ListKey = (ProviderKind, String);

#[derive(Debug, Clone)]
pub struct CachedList {
    pub servers: Arc<Vec<Server>>,
    pub fetched_at: Instant,
    pub fetched_at_utc: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Default)]
struct Entry {
    good: Option<CachedList>,
    /// The last fetch's error, cleared by a successful fetch.
    error: Option<String>,
}

#[derive(Debug, Default)]
pub struct ListCache {
    entries: HashMap<ListKey, Entry>,
}

impl ListCache {
    /// The list for `key` if it was fetched less than [`LIST_TTL`] before `now`.
    pub fn fresh(&self, key: &ListKey, now: Instant) -> Option<CachedList> {
        self.entries
            .get(key)
            .and_then(|e| e.good.as_ref())
            .filter(|l| now.saturating_duration_since(l.fetched_at) < LIST_TTL)
            .cloned()
    }

    /// The last good list whatever its age (used when a refetch fails).
    pub fn last_good(&self, key: &ListKey) -> Option<CachedList> {
        self.entries.get(key).and_then(|e| e.good.clone())
    }

    pub fn error(&self, key: &ListKey) -> Option<String> {
        self.entries.get(key).and_then(|e| e.error.clone())
    }

    pub fn store(&mut self, key: ListKey, servers: Vec<Server>, now: Instant) -> CachedList {
        let list = CachedList {
            servers: Arc::new(servers),
            fetched_at: now,
            fetched_at_utc: chrono::Utc::now(),
        };
        let entry = self.entries.entry(key).or_default();
        entry.good = Some(list.clone());
        entry.error = None;
        list
    }

    /// Records a failed fetch; the last good list stays.
    pub fn failed(&mut self, key: ListKey, error: String) {
        self.entries.entry(key).or_default().error = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ListKey {
        (ProviderKind::Mullvad, "http://stand-in".into())
    }

    #[test]
    fn a_list_is_fresh_for_six_hours() {
        let t0 = Instant::now();
        let mut c = ListCache::default();
        assert!(c.fresh(&key(), t0).is_none());
        c.store(key(), vec![Server::new("a", "SE")], t0);
        let almost = t0 + LIST_TTL - Duration::from_secs(1);
        assert_eq!(c.fresh(&key(), almost).map(|l| l.servers.len()), Some(1));
        assert!(c.fresh(&key(), t0 + LIST_TTL).is_none(), "expired at 6 h");
        assert!(
            c.last_good(&key()).is_some(),
            "still there as the last good list"
        );
    }

    #[test]
    fn a_failed_fetch_keeps_the_last_good_list() {
        let t0 = Instant::now();
        let mut c = ListCache::default();
        c.store(key(), vec![Server::new("a", "SE")], t0);
        c.failed(key(), "connection refused".into());
        assert_eq!(c.error(&key()).as_deref(), Some("connection refused"));
        assert_eq!(c.last_good(&key()).map(|l| l.servers.len()), Some(1));
        assert!(c.fresh(&key(), t0).is_some());
        c.store(key(), vec![], t0 + Duration::from_secs(1));
        assert_eq!(c.error(&key()), None, "a good fetch clears the error");
    }
}
