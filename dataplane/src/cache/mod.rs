//! The LAN HTTP cache on the data plane: plain-HTTP responses covered by a cache rule are stored
//! in memory, on disk (written through io_uring DMA files, served with io_uring reads) or in
//! both tiers by size, and answered from there — ranges, conditional requests and coalesced
//! misses included.
//!
//! * [`store`]: the index shared by all cores, tiers, eviction, rebuild from disk at start.
//! * [`fill`]: one origin fetch per key while others wait (request coalescing).
//! * [`disk`]: writing an entry file crash-safely (temp name, header, rename).
//! * [`memory_body`]: memory-tier bodies, large ones in a sealed memfd for `sendfile(2)`.
//! * [`janitor`]: deleting files on a thread of its own, never on a core.
//! * [`serve`]: the request path — hit, miss with fill, bypass.
//! * [`stats`]: counters and the `proxy_cache_*` metrics.
//!
//! Rules, presets, keys, freshness, ranges, the entry format and eviction order are runtime-free
//! code in `switchyard_proto::cache`. Rules are part of the config snapshot (hot-reloaded);
//! storage is fixed at start.

pub mod disk;
pub mod fill;
pub mod janitor;
pub mod memory_body;
pub(crate) mod serve;
pub mod stats;
pub mod store;

pub use store::{CacheStore, EntryInfo, StorageKind, StoreSettings, Tier};

use std::time::Duration;
use switchyard_proto::cache::rules::RuleSet;

/// The hot-reloadable part of the cache configuration, compiled into each snapshot.
#[derive(Debug)]
pub struct CachePolicy {
    pub rules: RuleSet,
    pub default_ttl: Duration,
    pub max_file_size: u64,
}
