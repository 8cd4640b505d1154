//! The cache index shared by every core: which keys are stored, in which tier, and their
//! metadata. Bodies live in memory (`Vec<u8>` behind an `Arc`) or in files under the disk
//! directory, so a hit on one core and a fill on another share one copy of every object.
//!
//! Locking, so that no core waits behind the control plane: the index is one mutex-guarded
//! ordered map, and every holder keeps it for bounded work only. The request path takes it for
//! O(log n) steps (lookup, insert, eviction of the victims of one insert), and a lookup only
//! *tries* it for a few spins: if it stays taken the request is proxied uncached (miss reason
//! `index_busy`) rather than parking the core. The control plane's O(n) walks (API listing,
//! purges, expiry, checksum scrub) copy entries in chunks of [`CHUNK`] keys in key order, release
//! the lock between chunks and do their sorting, filtering and file reads outside it. Files are
//! deleted by the [`Janitor`] thread, never under the lock and never on a core.
//!
//! Disk layout: `<dir>/<ab>/<stem>-<unique>.entry` where `stem` is the hex hash of the key
//! (proto `cache::key::file_stem`) and `ab` its first two characters; each fill gets a fresh
//! name, so deleting a replaced entry can never remove its successor. Fills are written to
//! `<dir>/tmp/<stem>.<pid>.<n>.tmp` and renamed into place only when complete, so a crash never
//! leaves a servable half-written entry. [`CacheStore::open`] rebuilds the index from the entry
//! headers and removes leftovers from `tmp/`.

use super::janitor::Janitor;
use super::stats::CacheStats;
use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use switchyard_proto::cache::entry::{decode_header, header_len_hint, EntryMeta};
use switchyard_proto::cache::evict::{EvictPolicy, EvictionIndex};
use switchyard_proto::cache::key::file_stem;

/// How entries are placed (`cache.storage.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageKind {
    Memory,
    Disk,
    Tiered,
}

impl StorageKind {
    pub fn label(self) -> &'static str {
        match self {
            StorageKind::Memory => "memory",
            StorageKind::Disk => "disk",
            StorageKind::Tiered => "tiered",
        }
    }
}

/// Where one entry's body lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Memory,
    Disk,
}

impl Tier {
    pub fn label(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Disk => "disk",
        }
    }
}

/// Storage settings, fixed for the life of the process (changing them needs a restart).
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub kind: StorageKind,
    pub memory_max_bytes: u64,
    pub memory_max_entries: u64,
    pub memory_policy: EvictPolicy,
    pub disk_dir: PathBuf,
    pub disk_max_bytes: u64,
    /// Tiered: bodies of at most this many bytes go to memory, larger ones to disk.
    pub memory_threshold: u64,
}

/// A stored body.
#[derive(Debug)]
pub enum Body {
    Memory(super::memory_body::MemoryBody),
    /// The entry file; the body starts at `offset` (after the header block).
    Disk {
        path: PathBuf,
        offset: u64,
    },
}

/// One cached response.
#[derive(Debug)]
pub struct Entry {
    pub meta: EntryMeta,
    pub body: Body,
    /// The head of a full `200` answer up to (not including) `Age`, `Connection` and the final
    /// empty line, serialised once so the common hit writes it without rebuilding headers.
    pub full_head: Vec<u8>,
}

impl Entry {
    pub fn new(meta: EntryMeta, body: Body) -> Entry {
        let mut head = switchyard_proto::http1::ResponseHead {
            version_minor: 1,
            status: 200,
            reason: "OK".to_owned(),
            headers: meta
                .headers
                .iter()
                .map(|(n, v)| switchyard_proto::http1::Header::new(n, v))
                .collect(),
        };
        head.set_header("Content-Length", meta.body_len.to_string().as_bytes());
        head.set_header("Accept-Ranges", b"bytes");
        head.set_header("X-Cache", b"HIT");
        let mut full_head = Vec::with_capacity(256);
        switchyard_proto::http1::write_response_head(&head, &mut full_head);
        // Drop the final empty line: Age and Connection follow per response.
        full_head.truncate(full_head.len().saturating_sub(2));
        Entry {
            meta,
            body,
            full_head,
        }
    }

    pub fn tier(&self) -> Tier {
        match self.body {
            Body::Memory(_) => Tier::Memory,
            Body::Disk { .. } => Tier::Disk,
        }
    }

    pub fn expired(&self, now_unix: u64) -> bool {
        self.meta.expires_unix <= now_unix
    }
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Keys copied per lock hold by the control plane's walks over the index.
pub const CHUNK: usize = 256;
/// Attempts of a request-path lookup to take the index before giving up (`index_busy`).
const LOOKUP_SPINS: u32 = 200;

/// A lookup's answer.
pub enum Lookup {
    Hit(Arc<Entry>),
    Miss,
    /// The index stayed locked (a control-plane walk); proxy the request uncached.
    Busy,
}

struct Index {
    /// Ordered, so the control plane can walk it in chunks from a cursor.
    entries: BTreeMap<String, Arc<Entry>>,
    /// Base key → the request headers its stored responses vary on (`respect_cache_control`).
    vary: HashMap<String, Vec<String>>,
    memory: EvictionIndex<String>,
    disk: EvictionIndex<String>,
}

impl Index {
    fn tier_index(&mut self, tier: Tier) -> &mut EvictionIndex<String> {
        match tier {
            Tier::Memory => &mut self.memory,
            Tier::Disk => &mut self.disk,
        }
    }

    /// Removes `key` from the map and its tier; returns the entry (its file is the caller's to
    /// delete, outside the lock).
    fn take(&mut self, key: &str) -> Option<Arc<Entry>> {
        let entry = self.entries.remove(key)?;
        self.tier_index(entry.tier()).remove(&key.to_owned());
        Some(entry)
    }
}

/// Why entries left the cache (`proxy_cache_evictions_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    /// Made room for a new entry.
    Capacity,
    Expired,
    /// Removed through the API.
    Purged,
    /// Replaced by a fresh copy of the same key.
    Replaced,
    /// Its file was unreadable or damaged.
    Damaged,
}

impl EvictReason {
    pub fn label(self) -> &'static str {
        match self {
            EvictReason::Capacity => "capacity",
            EvictReason::Expired => "expired",
            EvictReason::Purged => "purged",
            EvictReason::Replaced => "replaced",
            EvictReason::Damaged => "damaged",
        }
    }
}

/// Metadata of one entry for listings (the API's CacheEntry).
#[derive(Debug, Clone)]
pub struct EntryInfo {
    pub key: String,
    pub url: String,
    pub host: String,
    pub size: u64,
    pub content_type: String,
    pub created_unix: u64,
    pub expires_unix: u64,
    pub tier: Tier,
}

fn info(entry: &Entry) -> EntryInfo {
    EntryInfo {
        key: entry.meta.key.clone(),
        url: entry.meta.url.clone(),
        host: entry.meta.host.clone(),
        size: entry.meta.body_len,
        content_type: entry.meta.content_type.clone(),
        created_unix: entry.meta.created_unix,
        expires_unix: entry.meta.expires_unix,
        tier: entry.tier(),
    }
}

/// Sizes of one tier.
#[derive(Debug, Clone, Copy, Default)]
pub struct TierUsage {
    pub entries: u64,
    pub size_bytes: u64,
    pub max_size_bytes: u64,
}

/// The cache shared by all cores.
pub struct CacheStore {
    pub settings: StoreSettings,
    index: Mutex<Index>,
    pub(crate) fills: super::fill::Fills,
    pub stats: CacheStats,
    temp_seq: AtomicU64,
    janitor: Janitor,
    /// Key of the last entry [`CacheStore::scrub`] verified.
    scrub_cursor: Mutex<String>,
}

impl std::fmt::Debug for CacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheStore")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What [`CacheStore::open`] found on disk.
#[derive(Debug, Default, Clone, Copy)]
pub struct RebuildReport {
    pub loaded: u64,
    pub loaded_bytes: u64,
    pub expired: u64,
    pub damaged: u64,
    pub temp_removed: u64,
}

impl CacheStore {
    /// Creates the store and, for disk and tiered storage, rebuilds the index from the entry
    /// files. An unusable directory is reported in the log and by `store_error` counts, never
    /// fatal: requests are then proxied uncached.
    pub fn open(settings: StoreSettings) -> (Arc<Self>, RebuildReport) {
        let memory_bytes = match settings.kind {
            StorageKind::Disk => 0,
            _ => settings.memory_max_bytes,
        };
        let disk_bytes = match settings.kind {
            StorageKind::Memory => 0,
            _ => settings.disk_max_bytes,
        };
        let index = Index {
            entries: BTreeMap::new(),
            vary: HashMap::new(),
            memory: EvictionIndex::new(
                settings.memory_policy,
                memory_bytes,
                settings.memory_max_entries,
            ),
            // Disk entries are large and few; LRU keeps the hot set.
            disk: EvictionIndex::new(EvictPolicy::Lru, disk_bytes, u64::MAX),
        };
        let store = Arc::new(CacheStore {
            settings,
            index: Mutex::new(index),
            fills: Default::default(),
            stats: CacheStats::new(),
            temp_seq: AtomicU64::new(0),
            janitor: Janitor::start(),
            scrub_cursor: Mutex::new(String::new()),
        });
        let mut report = RebuildReport::default();
        if store.settings.kind != StorageKind::Memory {
            report = store.rebuild();
        }
        store.refresh_gauges();
        (store, report)
    }

    /// Tier for a body of `len` bytes, or `None` when no tier can hold it.
    pub fn tier_for(&self, len: u64) -> Option<Tier> {
        let tier = match self.settings.kind {
            StorageKind::Memory => Tier::Memory,
            StorageKind::Disk => Tier::Disk,
            StorageKind::Tiered if len <= self.settings.memory_threshold => Tier::Memory,
            StorageKind::Tiered => Tier::Disk,
        };
        let fits = {
            let mut index = self.index.lock();
            index.tier_index(tier).fits(len)
        };
        fits.then_some(tier)
    }

    /// The index for the request path: a few attempts without parking, then `None`.
    fn try_index(&self) -> Option<MutexGuard<'_, Index>> {
        for _ in 0..LOOKUP_SPINS {
            if let Some(index) = self.index.try_lock() {
                return Some(index);
            }
            std::hint::spin_loop();
        }
        None
    }

    /// The live entry for `key`, counting a use; expired entries are removed on the way.
    pub fn lookup(&self, key: &str) -> Lookup {
        let now = now_unix();
        let Some(mut index) = self.try_index() else {
            return Lookup::Busy;
        };
        let Some(entry) = index.entries.get(key).cloned() else {
            return Lookup::Miss;
        };
        if entry.expired(now) {
            let gone = index.take(key);
            drop(index);
            if let Some(gone) = gone {
                self.discard(&gone, EvictReason::Expired);
            }
            return Lookup::Miss;
        }
        index.tier_index(entry.tier()).touch(&key.to_owned());
        Lookup::Hit(entry)
    }

    /// The request headers responses under `base_key` vary on, if they do (`None` also when
    /// the index is busy: the lookup then reports it).
    pub fn vary_of(&self, base_key: &str) -> Option<Vec<String>> {
        let index = self.try_index()?;
        if index.vary.is_empty() {
            return None;
        }
        index.vary.get(base_key).cloned()
    }

    pub fn set_vary(&self, base_key: &str, names: Vec<String>) {
        let mut index = self.index.lock();
        // Bounded: forgetting a mapping only costs a miss for that URL's variants.
        if index.vary.len() >= 100_000 {
            index.vary.clear();
        }
        index.vary.insert(base_key.to_owned(), names);
    }

    /// Metadata of `key` without counting a use.
    pub fn peek(&self, key: &str) -> Option<EntryInfo> {
        self.index.lock().entries.get(key).map(|e| info(e))
    }

    /// Adds (or replaces) an entry, evicting others of its tier as needed. Returns false when
    /// the tier cannot hold it (the body is then dropped, and a disk file deleted).
    pub fn insert(&self, entry: Entry) -> bool {
        let key = entry.meta.key.clone();
        let tier = entry.tier();
        let size = entry.meta.body_len;
        let mut index = self.index.lock();
        let replaced = index.take(&key);
        if !index.tier_index(tier).fits(size) {
            drop(index);
            if let Some(old) = replaced {
                self.discard(&old, EvictReason::Replaced);
            }
            self.remove_body_file(&entry);
            return false;
        }
        let victims = index.tier_index(tier).insert(key.clone(), size);
        let victims: Vec<Arc<Entry>> = victims
            .into_iter()
            .filter_map(|(k, _)| index.entries.remove(&k))
            .collect();
        index.entries.insert(key, Arc::new(entry));
        drop(index);
        if let Some(old) = replaced {
            self.discard(&old, EvictReason::Replaced);
        }
        for victim in &victims {
            self.discard(victim, EvictReason::Capacity);
        }
        self.refresh_gauges();
        true
    }

    /// Removes one entry; true if it existed.
    pub fn remove(&self, key: &str, reason: EvictReason) -> bool {
        let gone = self.index.lock().take(key);
        match gone {
            Some(entry) => {
                self.discard(&entry, reason);
                self.refresh_gauges();
                true
            }
            None => false,
        }
    }

    /// Visits entries in key order after `after` (from the start when `None`), [`CHUNK`] per
    /// lock hold; `visit` runs outside the lock and returns false to stop.
    fn walk(&self, after: Option<&str>, mut visit: impl FnMut(&Arc<Entry>) -> bool) {
        let mut cursor: Option<String> = after.map(str::to_owned);
        loop {
            let chunk: Vec<Arc<Entry>> = {
                let index = self.index.lock();
                let from = match &cursor {
                    Some(c) => Bound::Excluded(c.as_str()),
                    None => Bound::Unbounded,
                };
                index
                    .entries
                    .range::<str, _>((from, Bound::Unbounded))
                    .take(CHUNK)
                    .map(|(_, e)| e.clone())
                    .collect()
            };
            let Some(last) = chunk.last() else {
                return;
            };
            cursor = Some(last.meta.key.clone());
            for entry in &chunk {
                if !visit(entry) {
                    return;
                }
            }
            if chunk.len() < CHUNK {
                return;
            }
        }
    }

    /// Removes `keys` (a chunk per lock hold) for `reason`; returns how many were there.
    fn remove_keys(&self, keys: &[String], reason: EvictReason) -> u64 {
        let mut removed = 0;
        for chunk in keys.chunks(CHUNK) {
            let gone: Vec<Arc<Entry>> = {
                let mut index = self.index.lock();
                chunk.iter().filter_map(|k| index.take(k)).collect()
            };
            for entry in &gone {
                self.discard(entry, reason);
            }
            removed += gone.len() as u64;
        }
        self.refresh_gauges();
        removed
    }

    /// Removes every entry whose host matches `matches`; returns how many.
    pub fn remove_where(&self, matches: impl Fn(&str) -> bool) -> u64 {
        let mut keys = Vec::new();
        self.walk(None, |e| {
            if matches(&e.meta.host) {
                keys.push(e.meta.key.clone());
            }
            true
        });
        self.remove_keys(&keys, EvictReason::Purged)
    }

    /// Removes expired entries (the periodic cleanup); returns how many.
    pub fn purge_expired(&self) -> u64 {
        let now = now_unix();
        let mut keys = Vec::new();
        self.walk(None, |e| {
            if e.expired(now) {
                keys.push(e.meta.key.clone());
            }
            true
        });
        self.remove_keys(&keys, EvictReason::Expired)
    }

    /// Verifies the body checksums of disk entries, in key order from where the previous call
    /// stopped, reading at most `budget` bytes; entries whose file no longer matches (bit rot,
    /// outside edits) are removed. Returns (entries checked, entries removed). Runs on a blocking
    /// thread: it reads files with plain reads, never while holding the index.
    pub fn scrub(&self, budget: u64) -> (u64, u64) {
        let cursor = self.scrub_cursor.lock().clone();
        let (mut checked, mut removed, mut read) = (0, 0, 0u64);
        let mut check = |entry: &Arc<Entry>| -> bool {
            if read >= budget {
                return false;
            }
            let Body::Disk { path, offset } = &entry.body else {
                return true;
            };
            read += entry.meta.body_len;
            checked += 1;
            *self.scrub_cursor.lock() = entry.meta.key.clone();
            match body_checksum(path, *offset, entry.meta.body_len) {
                Ok(sum) if sum == entry.meta.body_checksum => {}
                Ok(_) | Err(_) => {
                    tracing::warn!(key = %entry.meta.key, file = %path.display(),
                        "cache entry failed its checksum; removed");
                    if self.remove(&entry.meta.key, EvictReason::Damaged) {
                        removed += 1;
                    }
                }
            }
            true
        };
        // From the cursor to the end, then from the start up to the cursor.
        let mut wrapped = true;
        self.walk(Some(&cursor), |e| {
            wrapped = check(e);
            wrapped
        });
        if wrapped && !cursor.is_empty() {
            self.walk(None, |e| e.meta.key <= cursor && check(e));
        }
        (checked, removed)
    }

    /// Entries whose host matches `matches`, in key order: `(page, total)`.
    pub fn list(
        &self,
        matches: impl Fn(&str) -> bool,
        offset: usize,
        limit: usize,
    ) -> (Vec<EntryInfo>, usize) {
        let (mut page, mut total) = (Vec::new(), 0usize);
        self.walk(None, |e| {
            if matches(&e.meta.host) {
                if total >= offset && page.len() < limit {
                    page.push(info(e));
                }
                total += 1;
            }
            true
        });
        (page, total)
    }

    pub fn usage(&self, tier: Tier) -> TierUsage {
        let mut index = self.index.lock();
        let t = index.tier_index(tier);
        let max = match (tier, self.settings.kind) {
            (Tier::Memory, StorageKind::Disk) | (Tier::Disk, StorageKind::Memory) => 0,
            (Tier::Memory, _) => self.settings.memory_max_bytes,
            (Tier::Disk, _) => self.settings.disk_max_bytes,
        };
        TierUsage {
            entries: t.len() as u64,
            size_bytes: t.bytes(),
            max_size_bytes: max,
        }
    }

    fn refresh_gauges(&self) {
        for tier in [Tier::Memory, Tier::Disk] {
            let usage = self.usage(tier);
            self.stats.set_usage(tier, usage.entries, usage.size_bytes);
        }
    }

    /// Accounts for an entry that left the index and has the janitor delete its file.
    fn discard(&self, entry: &Entry, reason: EvictReason) {
        self.stats.evicted(entry.tier(), reason);
        self.remove_body_file(entry);
    }

    fn remove_body_file(&self, entry: &Entry) {
        if let Body::Disk { path, .. } = &entry.body {
            self.janitor.remove(path.clone());
        }
    }

    /// A handle for deleting files off the caller's thread.
    pub fn janitor(&self) -> Janitor {
        self.janitor.clone()
    }

    /// Waits until every file deletion handed to the janitor so far is done.
    pub fn flush_deletions(&self) {
        self.janitor.flush();
    }

    /// A fresh path for the entry file of a fill of `key`: unique per fill (time and
    /// sequence), so the file of a replaced entry and its successor never share a name.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        let stem = file_stem(key);
        let fan = stem.get(..2).unwrap_or("00").to_owned();
        let n = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        self.settings
            .disk_dir
            .join(fan)
            .join(format!("{stem}-{nanos:x}{n:x}.entry"))
    }

    /// A fresh temporary path for a fill of `key` (same filesystem as the entries).
    pub fn temp_path(&self, key: &str) -> PathBuf {
        let n = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        self.settings.disk_dir.join("tmp").join(format!(
            "{}.{}.{n}.tmp",
            file_stem(key),
            std::process::id()
        ))
    }

    fn rebuild(&self) -> RebuildReport {
        let mut report = RebuildReport::default();
        let dir = &self.settings.disk_dir;
        if let Err(e) = std::fs::create_dir_all(dir.join("tmp")) {
            tracing::error!(dir = %dir.display(), error = %e, "cache directory unusable; disk entries will not be stored");
            return report;
        }
        if let Ok(tmp) = std::fs::read_dir(dir.join("tmp")) {
            for f in tmp.flatten() {
                if std::fs::remove_file(f.path()).is_ok() {
                    report.temp_removed += 1;
                }
            }
        }
        let now = now_unix();
        let Ok(fans) = std::fs::read_dir(dir) else {
            return report;
        };
        for fan in fans.flatten() {
            let fan_path = fan.path();
            if fan.file_name() == "tmp" || !fan_path.is_dir() {
                continue;
            }
            let Ok(files) = std::fs::read_dir(&fan_path) else {
                continue;
            };
            for f in files.flatten() {
                let path = f.path();
                if path.extension().is_none_or(|e| e != "entry") {
                    continue;
                }
                match read_entry_header(&path) {
                    Ok((meta, _)) if meta.expires_unix <= now => {
                        let _ = std::fs::remove_file(&path);
                        report.expired += 1;
                    }
                    Ok((meta, _))
                        if self
                            .peek(&meta.key)
                            .is_some_and(|e| e.created_unix >= meta.created_unix) =>
                    {
                        // An older copy of a key whose newer file was already indexed (a crash
                        // between storing a replacement and deleting its predecessor).
                        let _ = std::fs::remove_file(&path);
                        report.expired += 1;
                    }
                    Ok((meta, offset)) => {
                        let size = meta.body_len;
                        let entry = Entry::new(meta, Body::Disk { path, offset });
                        if self.insert(entry) {
                            report.loaded += 1;
                            report.loaded_bytes += size;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "removing damaged cache entry");
                        let _ = std::fs::remove_file(&path);
                        report.damaged += 1;
                    }
                }
            }
        }
        report
    }
}

/// Reads and checks an entry file's header: the file must be exactly header + body long.
pub fn read_entry_header(path: &Path) -> Result<(EntryMeta, u64), String> {
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let file_len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut first = vec![0u8; 4096];
    let n = read_up_to(&mut file, &mut first).map_err(|e| e.to_string())?;
    first.truncate(n);
    let want = header_len_hint(&first).ok_or("not a cache entry")?;
    if want > first.len() {
        let mut rest = vec![0u8; want - first.len()];
        let m = read_up_to(&mut file, &mut rest).map_err(|e| e.to_string())?;
        rest.truncate(m);
        first.extend_from_slice(&rest);
    }
    let (meta, header_len) = decode_header(&first).map_err(|e| e.to_string())?;
    let expected = header_len as u64 + meta.body_len;
    if file_len != expected {
        return Err(format!(
            "file is {file_len} bytes, header says {expected} (incomplete or truncated)"
        ));
    }
    Ok((meta, header_len as u64))
}

/// CRC-32C of `len` body bytes starting at `offset` of `path`.
fn body_checksum(path: &Path, offset: u64, len: u64) -> std::io::Result<u32> {
    use std::io::{Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut sum = switchyard_proto::cache::entry::BodyChecksum::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let n = read_up_to(&mut file, buf.get_mut(..want).unwrap_or_default())?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        sum.update(buf.get(..n).unwrap_or_default());
        left -= n as u64;
    }
    Ok(sum.finish())
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(buf.get_mut(filled..).unwrap_or_default())?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::cache::evict::EvictPolicy;

    fn memory_store() -> Arc<CacheStore> {
        CacheStore::open(StoreSettings {
            kind: StorageKind::Memory,
            memory_max_bytes: 1 << 30,
            memory_max_entries: 100_000,
            memory_policy: EvictPolicy::Lru,
            disk_dir: std::env::temp_dir(),
            disk_max_bytes: 0,
            memory_threshold: 0,
        })
        .0
    }

    fn entry(key: &str, host: &str, expires_unix: u64) -> Entry {
        Entry::new(
            EntryMeta {
                key: key.to_owned(),
                url: format!("http://{host}/{key}"),
                host: host.to_owned(),
                status: 200,
                headers: Vec::new(),
                content_type: String::new(),
                body_len: 1,
                body_checksum: 0,
                created_unix: 1,
                expires_unix,
            },
            Body::Memory(super::super::memory_body::MemoryBody::new(vec![b'x'])),
        )
    }

    #[test]
    fn walks_span_chunks_in_key_order() {
        let store = memory_store();
        let later = now_unix() + 3600;
        let n = CHUNK * 2 + 10;
        for i in 0..n {
            let host = if i % 2 == 0 { "even.test" } else { "odd.test" };
            assert!(store.insert(entry(&format!("k{i:05}"), host, later)));
        }
        let (page, total) = store.list(|h| h == "even.test", CHUNK - 3, 10);
        assert_eq!(total, n.div_ceil(2));
        let keys: Vec<&str> = page.iter().map(|e| e.key.as_str()).collect();
        let want: Vec<String> = (0..n)
            .step_by(2)
            .skip(CHUNK - 3)
            .take(10)
            .map(|i| format!("k{i:05}"))
            .collect();
        assert_eq!(keys, want);
        assert_eq!(store.remove_where(|h| h == "odd.test"), (n / 2) as u64);
        assert_eq!(store.list(|_| true, 0, usize::MAX).1, n.div_ceil(2));
        assert!(store.insert(entry("expired", "even.test", 1)));
        assert_eq!(store.purge_expired(), 1);
        assert!(matches!(store.lookup("k00000"), Lookup::Hit(_)));
        assert!(matches!(store.lookup("k00001"), Lookup::Miss));
    }

    #[test]
    fn a_lookup_does_not_wait_for_a_held_index() {
        let store = memory_store();
        assert!(store.insert(entry("k", "h.test", now_unix() + 60)));
        let held = store.index.lock();
        assert!(matches!(store.lookup("k"), Lookup::Busy));
        assert_eq!(store.vary_of("k"), None);
        drop(held);
        assert!(matches!(store.lookup("k"), Lookup::Hit(_)));
    }
}
