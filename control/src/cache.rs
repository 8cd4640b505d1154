//! Starting the HTTP cache's store for `switchyard server` and its periodic cleanup. The store
//! itself (and the request path) lives on the data plane; the control plane opens it, reports
//! what the index rebuild found, removes expired and damaged entries every `cleanup_interval`,
//! and serves the cache API from it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_config::cache::{CacheConfig, EvictPolicy as ConfigEvictPolicy, StorageType};
use switchyard_dataplane::cache::{CacheStore, StorageKind, StoreSettings};
use switchyard_proto::cache::evict::EvictPolicy;

pub fn settings(cfg: &CacheConfig) -> StoreSettings {
    let storage = &cfg.storage;
    StoreSettings {
        kind: match storage.r#type {
            StorageType::Memory => StorageKind::Memory,
            StorageType::Disk => StorageKind::Disk,
            StorageType::Tiered => StorageKind::Tiered,
        },
        memory_max_bytes: storage.memory.max_size.0,
        memory_max_entries: storage.memory.max_entries,
        memory_policy: match storage.memory.evict_policy {
            ConfigEvictPolicy::Lru => EvictPolicy::Lru,
            ConfigEvictPolicy::Lfu => EvictPolicy::Lfu,
            ConfigEvictPolicy::Fifo => EvictPolicy::Fifo,
        },
        disk_dir: PathBuf::from(&storage.disk.path),
        disk_max_bytes: storage.disk.max_size.0,
        memory_threshold: storage.tiered.memory_threshold.0,
    }
}

/// Opens the store when caching is on (rebuilding the disk index) and logs what it holds.
pub fn open(cfg: &CacheConfig) -> Option<Arc<CacheStore>> {
    if !cfg.enabled {
        return None;
    }
    let (store, report) = CacheStore::open(settings(cfg));
    let s = &store.settings;
    tracing::info!(
        storage = s.kind.label(),
        memory_max_bytes = s.memory_max_bytes,
        disk = %s.disk_dir.display(),
        disk_max_bytes = s.disk_max_bytes,
        entries_loaded = report.loaded,
        bytes_loaded = report.loaded_bytes,
        expired_removed = report.expired,
        damaged_removed = report.damaged,
        incomplete_removed = report.temp_removed,
        "HTTP cache ready"
    );
    Some(store)
}

/// Bytes of disk entries whose checksums are verified per cleanup round.
const SCRUB_BUDGET: u64 = 1 << 30;

/// Every `interval`: removes expired entries, then verifies the checksums of up to 1 GiB of disk
/// entries (continuing where the last round stopped) and removes damaged ones. Both run on the
/// blocking pool (file reads and deletions).
pub async fn cleanup(store: Arc<CacheStore>, interval: Duration) {
    if interval.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(interval);
    tick.tick().await;
    loop {
        tick.tick().await;
        let store = store.clone();
        let round =
            tokio::task::spawn_blocking(move || (store.purge_expired(), store.scrub(SCRUB_BUDGET)))
                .await;
        match round {
            Ok((expired, (checked, damaged))) => {
                if expired > 0 || damaged > 0 {
                    tracing::info!(expired, checked, damaged, "cache cleanup removed entries");
                } else {
                    tracing::debug!(checked, "cache cleanup: nothing to remove");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cache cleanup failed"),
        }
    }
}
