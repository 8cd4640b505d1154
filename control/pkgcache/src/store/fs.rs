//! File-system store.
//!
//! Layout under the root directory:
//! - `packages/<name>/<version>/<sha>`: complete packages;
//! - `packages/<name>/<version>/<sha>.meta`: sidecar `{"size":…,"sha256":…}`;
//! - `tmp/`: uploads in progress, under random names (unique across servers and containers
//!   sharing the directory, where PIDs repeat). At start, only files untouched for
//!   [`STALE_TEMP_AGE`] are removed: a younger one may be another server's upload in flight.
//!
//! An upload streams into a new file under `tmp/` (one blocking writer per upload, fed through a
//! bounded channel, hashing as it writes), is fsynced, and is then hard-linked to its final name.
//! `link(2)` fails when the name exists, so of two concurrent uploads of one package exactly one
//! wins — also across several servers sharing the directory — and the other gets 409. A dropped
//! connection or a `kill -9` leaves at most a file in `tmp/`, which is never served. Every
//! directory entry an upload creates is made durable before the upload is acknowledged: a new
//! `name/` or `version/` directory by an fsync of its parent, the package by an fsync of
//! `version/` after the link, so an acknowledged upload survives a power cut.
//!
//! Packages up to 64 KiB are kept in a 64 MiB in-memory cache once served (packages are
//! immutable). A DELETE through this server drops the entry; a package deleted behind its back
//! (by hand, or by another server sharing the directory) may be served from memory until evicted.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{body_error, check_limit, ByteStream, PackageBody, PackageMeta, Totals};
use crate::error::{storage, Error};
use crate::key::{is_package_file_name, PackageKey};

/// Packages up to this size are read in one go; larger ones stream.
const SMALL: u64 = 64 * 1024;
/// Chunk size of streamed GET bodies.
const READ_CHUNK: usize = 256 * 1024;
/// Chunks queued between the request body and the writer thread (bounds upload memory).
const WRITE_QUEUE: usize = 4;
/// Bytes of small packages kept in memory (packages are immutable, so a hit needs no I/O).
const SMALL_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// A temp file not written to for this long is taken for a leftover (an upload whose server
/// died): an upload in flight modifies its file with every chunk, so only one stalled for an
/// hour could be mistaken for one (its link then fails and the client gets a retryable 500).
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Small packages recently stored or served, evicted first-in first-out.
#[derive(Default)]
struct SmallCache {
    map: std::collections::HashMap<PackageKey, (PackageMeta, Bytes)>,
    order: std::collections::VecDeque<PackageKey>,
    bytes: usize,
}

impl SmallCache {
    fn get(&self, key: &PackageKey) -> Option<(PackageMeta, Bytes)> {
        self.map.get(key).cloned()
    }

    fn insert(&mut self, key: PackageKey, meta: PackageMeta, body: Bytes) {
        if meta.etag.is_none() || self.map.contains_key(&key) {
            return;
        }
        self.bytes += body.len();
        self.order.push_back(key.clone());
        self.map.insert(key, (meta, body));
        while self.bytes > SMALL_CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((_, b)) = self.map.remove(&old) {
                self.bytes -= b.len();
            }
        }
    }

    fn remove(&mut self, key: &PackageKey) {
        if let Some((_, b)) = self.map.remove(key) {
            self.bytes -= b.len();
            self.order.retain(|k| k != key);
        }
    }
}

/// The file-system store.
pub struct FsStore {
    root: PathBuf,
    packages: PathBuf,
    tmp: PathBuf,
    inflight: Arc<Mutex<HashSet<PackageKey>>>,
    small: Mutex<SmallCache>,
}

/// Removes the key from the in-flight set when the upload ends, however it ends.
struct Inflight {
    set: Arc<Mutex<HashSet<PackageKey>>>,
    key: PackageKey,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

enum Msg {
    Data(Bytes),
    Done,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Storage(format!("blocking task failed: {e}")))?
}

fn read_meta(path: &Path, size: u64) -> Option<String> {
    let text = fs::read(path).ok()?;
    let meta: PackageMeta = serde_json::from_slice(&text).ok()?;
    (meta.size == size).then_some(meta.etag).flatten()
}

impl FsStore {
    /// Opens (creating) the store at `root` and removes leftovers of interrupted uploads that
    /// are older than [`STALE_TEMP_AGE`].
    pub fn open(root: &Path) -> io::Result<FsStore> {
        let packages = root.join("packages");
        let tmp = root.join("tmp");
        fs::create_dir_all(&packages)?;
        fs::create_dir_all(&tmp)?;
        let root = fs::canonicalize(root)?;
        let removed = remove_stale_temp_files(&tmp, STALE_TEMP_AGE)?;
        if removed > 0 {
            tracing::info!(
                removed,
                "removed leftovers of interrupted uploads from {}",
                tmp.display()
            );
        }
        Ok(FsStore {
            packages: root.join("packages"),
            tmp: root.join("tmp"),
            root,
            inflight: Arc::default(),
            small: Mutex::default(),
        })
    }

    pub fn describe(&self) -> String {
        self.root.display().to_string()
    }

    fn data_path(&self, key: &PackageKey) -> PathBuf {
        self.packages.join(key.rel_path())
    }

    fn meta_path(data: &Path) -> PathBuf {
        let mut p = data.as_os_str().to_owned();
        p.push(".meta");
        PathBuf::from(p)
    }

    fn temp_path(&self, what: &str) -> Result<PathBuf, Error> {
        let mut r = [0u8; 16];
        getrandom::fill(&mut r)
            .map_err(|e| Error::Storage(format!("no random temp-file name: {e}")))?;
        Ok(self.tmp.join(format!("{}-{what}.part", hex::encode(r))))
    }

    fn cached(&self, key: &PackageKey) -> Option<(PackageMeta, Bytes)> {
        self.small
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
    }

    pub async fn head(&self, key: &PackageKey) -> Result<Option<PackageMeta>, Error> {
        if let Some((meta, _)) = self.cached(key) {
            return Ok(Some(meta));
        }
        let data = self.data_path(key);
        blocking(move || {
            let md = match fs::metadata(&data) {
                Ok(m) if m.is_file() => m,
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(storage(e)),
            };
            let etag = read_meta(&Self::meta_path(&data), md.len());
            Ok(Some(PackageMeta {
                size: md.len(),
                etag,
            }))
        })
        .await
    }

    pub async fn get(&self, key: &PackageKey) -> Result<Option<(PackageMeta, PackageBody)>, Error> {
        if let Some((meta, body)) = self.cached(key) {
            return Ok(Some((meta, PackageBody::Full(body))));
        }
        let data = self.data_path(key);
        let opened = blocking(move || {
            let mut file = match File::open(&data) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(storage(e)),
            };
            let md = file.metadata().map_err(storage)?;
            if !md.is_file() {
                return Ok(None);
            }
            let meta = PackageMeta {
                size: md.len(),
                etag: read_meta(&Self::meta_path(&data), md.len()),
            };
            if md.len() <= SMALL {
                let mut buf = Vec::with_capacity(md.len() as usize);
                file.read_to_end(&mut buf).map_err(storage)?;
                let meta = PackageMeta {
                    size: buf.len() as u64,
                    ..meta
                };
                return Ok(Some((meta, Ok(Bytes::from(buf)))));
            }
            Ok(Some((meta, Err(file))))
        })
        .await?;
        Ok(opened.map(|(meta, body)| {
            let body = match body {
                Ok(bytes) => {
                    self.small.lock().unwrap_or_else(|e| e.into_inner()).insert(
                        key.clone(),
                        meta.clone(),
                        bytes.clone(),
                    );
                    PackageBody::Full(bytes)
                }
                Err(file) => {
                    let file = tokio::fs::File::from_std(file);
                    // The file is immutable once committed; stream exactly the size we report.
                    let limited = tokio::io::AsyncReadExt::take(file, meta.size);
                    PackageBody::Stream(Box::pin(tokio_util::io::ReaderStream::with_capacity(
                        limited, READ_CHUNK,
                    )))
                }
            };
            (meta, body)
        }))
    }

    pub async fn put(
        &self,
        key: &PackageKey,
        mut body: ByteStream,
        limit: u64,
    ) -> Result<PackageMeta, Error> {
        let data = self.data_path(key);
        let exists = {
            let d = data.clone();
            blocking(move || Ok(d.exists())).await?
        };
        if exists {
            return Err(Error::AlreadyExists);
        }
        let _inflight = {
            let mut set = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            if !set.insert(key.clone()) {
                return Err(Error::UploadInProgress);
            }
            Inflight {
                set: self.inflight.clone(),
                key: key.clone(),
            }
        };
        let tmp = self.temp_path("data")?;
        let meta_tmp = self.temp_path("meta")?;
        let (tx, rx) = mpsc::channel::<Msg>(WRITE_QUEUE);
        let packages = self.packages.clone();
        let writer = tokio::task::spawn_blocking(move || {
            write_upload(rx, &tmp, &meta_tmp, &packages, &data)
        });
        let mut total: u64 = 0;
        let mut failure: Option<Error> = None;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    failure = Some(body_error(e));
                    break;
                }
            };
            total += chunk.len() as u64;
            if let Err(e) = check_limit(total, limit) {
                failure = Some(e);
                break;
            }
            if tx.send(Msg::Data(chunk)).await.is_err() {
                break; // the writer failed; its error is returned below
            }
        }
        if failure.is_none() {
            // An error here means the writer already stopped; it reports why.
            let _ = tx.send(Msg::Done).await;
        }
        drop(tx);
        let result = writer
            .await
            .map_err(|e| Error::UploadFailed(format!("writer task failed: {e}")))?;
        match failure {
            Some(e) => Err(e),
            None => result,
        }
    }

    pub async fn delete(&self, key: &PackageKey) -> Result<Option<u64>, Error> {
        self.small
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        let data = self.data_path(key);
        let packages = self.packages.clone();
        blocking(move || {
            let size = match fs::metadata(&data) {
                Ok(m) if m.is_file() => m.len(),
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(storage(e)),
            };
            match fs::remove_file(&data) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(storage(e)),
            }
            let _ = fs::remove_file(Self::meta_path(&data));
            // Drop now-empty version and name directories (fails harmlessly when not empty).
            let mut dir = data.parent();
            while let Some(d) = dir {
                if d == packages || fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
            Ok(Some(size))
        })
        .await
    }

    pub async fn scan(&self) -> Result<Totals, Error> {
        let packages = self.packages.clone();
        blocking(move || {
            let mut totals = Totals::default();
            let mut missing_meta = Vec::new();
            for name in read_dirs(&packages)? {
                for version in read_dirs(&name)? {
                    for entry in fs::read_dir(&version).map_err(storage)? {
                        let entry = entry.map_err(storage)?;
                        let file_name = entry.file_name();
                        let Some(fname) = file_name.to_str() else {
                            continue;
                        };
                        if !is_package_file_name(fname) {
                            continue;
                        }
                        let md = entry.metadata().map_err(storage)?;
                        if !md.is_file() {
                            continue;
                        }
                        totals.packages += 1;
                        totals.bytes += md.len();
                        let path = entry.path();
                        if read_meta(&Self::meta_path(&path), md.len()).is_none() {
                            missing_meta.push(path);
                        }
                    }
                }
            }
            if !missing_meta.is_empty() {
                tracing::info!(
                    count = missing_meta.len(),
                    "computing missing ETags in the background"
                );
                std::thread::spawn(move || {
                    for path in missing_meta {
                        if let Err(e) = repair_meta(&path) {
                            tracing::warn!("cannot compute the ETag of {}: {e}", path.display());
                        }
                    }
                });
            }
            Ok(totals)
        })
        .await
    }

    pub async fn probe(&self, writable: bool) -> Result<(), Error> {
        let packages = self.packages.clone();
        let probe = self.temp_path("probe")?;
        blocking(move || {
            if !fs::metadata(&packages).map_err(storage)?.is_dir() {
                return Err(Error::Storage(format!(
                    "{} is not a directory",
                    packages.display()
                )));
            }
            if writable {
                let res = File::create(&probe).and_then(|mut f| f.write_all(b"ok"));
                let _ = fs::remove_file(&probe);
                res.map_err(|e| Error::Storage(format!("store not writable: {e}")))?;
            }
            Ok(())
        })
        .await
    }
}

/// Removes entries of `tmp` not modified for `max_age`; returns how many went.
fn remove_stale_temp_files(tmp: &Path, max_age: std::time::Duration) -> io::Result<usize> {
    let mut removed = 0usize;
    for entry in fs::read_dir(tmp)? {
        let path = entry?.path();
        let Ok(md) = fs::symlink_metadata(&path) else {
            continue; // gone meanwhile (another server finished or removed it)
        };
        let age = md.modified().ok().and_then(|m| m.elapsed().ok());
        if age.is_none_or(|a| a < max_age) {
            continue;
        }
        let res = if md.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match res {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("cannot remove leftover {}: {e}", path.display()),
        }
    }
    Ok(removed)
}

/// Creates `dir` below the existing `base` one level at a time, fsyncing the parent of each
/// directory it creates so that the new entry survives a power cut.
fn create_dirs_durably(base: &Path, dir: &Path) -> io::Result<()> {
    let rel = dir.strip_prefix(base).map_err(io::Error::other)?;
    let mut parent = base.to_path_buf();
    for part in rel.components() {
        let child = parent.join(part);
        match fs::create_dir(&child) {
            Ok(()) => File::open(&parent)?.sync_all()?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        parent = child;
    }
    Ok(())
}

fn read_dirs(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(storage)? {
        let entry = entry.map_err(storage)?;
        if entry.file_type().map_err(storage)?.is_dir() {
            out.push(entry.path());
        }
    }
    Ok(out)
}

fn write_meta(meta_tmp: &Path, data: &Path, meta: &PackageMeta) -> io::Result<()> {
    let json = serde_json::to_vec(meta).map_err(io::Error::other)?;
    fs::write(meta_tmp, json)?;
    fs::rename(meta_tmp, FsStore::meta_path(data))
}

fn repair_meta(path: &Path) -> io::Result<()> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    let meta = PackageMeta {
        size,
        etag: Some(hex::encode(hasher.finalize())),
    };
    let mut tmp = FsStore::meta_path(path).into_os_string();
    tmp.push(".tmp");
    write_meta(Path::new(&tmp), path, &meta)
}

/// The blocking writer of one upload: chunks → temp file (hashing), then fsync and link.
fn write_upload(
    mut rx: mpsc::Receiver<Msg>,
    tmp: &Path,
    meta_tmp: &Path,
    packages: &Path,
    data: &Path,
) -> Result<PackageMeta, Error> {
    let result = write_upload_inner(&mut rx, tmp, meta_tmp, packages, data);
    // The temp name is only ever a temp name: remove it whatever happened.
    let _ = fs::remove_file(tmp);
    if result.is_err() {
        let _ = fs::remove_file(meta_tmp);
    }
    result
}

fn write_upload_inner(
    rx: &mut mpsc::Receiver<Msg>,
    tmp: &Path,
    meta_tmp: &Path,
    packages: &Path,
    data: &Path,
) -> Result<PackageMeta, Error> {
    let failed = |what: &str, e: io::Error| Error::UploadFailed(format!("{what}: {e}"));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| failed("create temp file", e))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        match rx.blocking_recv() {
            Some(Msg::Data(chunk)) => {
                hasher.update(&chunk);
                file.write_all(&chunk).map_err(|e| failed("write", e))?;
                size += chunk.len() as u64;
            }
            Some(Msg::Done) => break,
            None => {
                return Err(Error::ClientAborted(
                    "request body ended early (connection closed)".into(),
                ))
            }
        }
    }
    file.sync_all().map_err(|e| failed("fsync", e))?;
    drop(file);
    let parent = data
        .parent()
        .ok_or_else(|| Error::UploadFailed("package path has no parent".into()))?;
    create_dirs_durably(packages, parent).map_err(|e| failed("create directory", e))?;
    match fs::hard_link(tmp, data) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(Error::AlreadyExists),
        Err(e) => return Err(failed("link into place", e)),
    }
    let meta = PackageMeta {
        size,
        etag: Some(hex::encode(hasher.finalize())),
    };
    if let Err(e) = write_meta(meta_tmp, data, &meta) {
        tracing::warn!("cannot write the sidecar of {}: {e}", data.display());
    }
    // Make the package's (and the sidecar's) directory entries durable before acknowledging.
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| failed("fsync the package directory", e))?;
    Ok(meta)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn body(chunks: Vec<&'static [u8]>) -> ByteStream {
        Box::pin(futures::stream::iter(
            chunks.into_iter().map(|c| Ok(Bytes::from_static(c))),
        ))
    }

    fn key(sha: &str) -> PackageKey {
        PackageKey::parse("zlib", "1.3", sha).unwrap()
    }

    #[tokio::test]
    async fn put_get_delete_roundtrip_and_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        let k = key("ab01");
        assert!(store.head(&k).await.unwrap().is_none());
        let meta = store
            .put(&k, body(vec![b"hello ", b"world"]), 0)
            .await
            .unwrap();
        assert_eq!(meta.size, 11);
        assert_eq!(
            meta.etag.as_deref(),
            Some("b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9")
        );
        assert_eq!(store.head(&k).await.unwrap(), Some(meta.clone()));
        match store.get(&k).await.unwrap() {
            Some((m, PackageBody::Full(b))) => {
                assert_eq!(m, meta);
                assert_eq!(&b[..], b"hello world");
            }
            _ => panic!("expected a small body"),
        }
        assert!(matches!(
            store.put(&k, body(vec![b"x"]), 0).await,
            Err(Error::AlreadyExists)
        ));
        assert_eq!(
            store.scan().await.unwrap(),
            Totals {
                packages: 1,
                bytes: 11
            }
        );
        assert_eq!(store.delete(&k).await.unwrap(), Some(11));
        // the in-memory copy went with it
        assert!(store.head(&k).await.unwrap().is_none());
        assert!(store.get(&k).await.unwrap().is_none());
        assert_eq!(store.delete(&k).await.unwrap(), None);
        assert_eq!(store.scan().await.unwrap(), Totals::default());
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn small_cache_is_bounded_fifo() {
        let mut c = SmallCache::default();
        let meta = |n: usize| PackageMeta {
            size: n as u64,
            etag: Some("e".into()),
        };
        let chunk = Bytes::from(vec![0u8; SMALL_CACHE_BYTES / 2]);
        for i in 0..3u8 {
            c.insert(key(&format!("{i:02x}")), meta(chunk.len()), chunk.clone());
        }
        assert!(c.bytes <= SMALL_CACHE_BYTES);
        assert!(c.get(&key("00")).is_none(), "oldest evicted");
        assert!(c.get(&key("02")).is_some());
        c.remove(&key("02"));
        assert!(c.get(&key("02")).is_none());
        // entries without ETag are not cached
        c.insert(
            key("aa"),
            PackageMeta {
                size: 1,
                etag: None,
            },
            Bytes::from_static(b"x"),
        );
        assert!(c.get(&key("aa")).is_none());
    }

    #[tokio::test]
    async fn failed_body_and_limit_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        let k = key("cd02");
        let broken: ByteStream = Box::pin(futures::stream::iter(vec![
            Ok(Bytes::from_static(b"part")),
            Err(io::Error::other("connection reset")),
        ]));
        assert!(matches!(
            store.put(&k, broken, 0).await,
            Err(Error::ClientAborted(_))
        ));
        assert!(matches!(
            store.put(&k, body(vec![b"12345", b"6"]), 5).await,
            Err(Error::TooLarge(5))
        ));
        assert!(store.head(&k).await.unwrap().is_none());
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        // the key is free again
        assert!(store.put(&k, body(vec![b"ok"]), 0).await.is_ok());
    }

    #[tokio::test]
    async fn stale_leftovers_are_removed_at_open_and_missing_meta_is_tolerated() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("tmp")).unwrap();
        let stale = dir.path().join("tmp/123-0-data.part");
        fs::write(&stale, b"half").unwrap();
        let old =
            std::time::SystemTime::now() - STALE_TEMP_AGE - std::time::Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let fresh = dir.path().join("tmp/another-server-data.part");
        fs::write(&fresh, b"in flight").unwrap();
        let p = dir.path().join("packages/a/1");
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("ff"), b"by hand").unwrap();
        let store = FsStore::open(dir.path()).unwrap();
        assert!(!stale.exists());
        assert!(
            fresh.exists(),
            "a young temp file may be another server's upload"
        );
        let k = PackageKey::parse("a", "1", "ff").unwrap();
        let m = store.head(&k).await.unwrap().unwrap();
        assert_eq!(m.size, 7);
        assert_eq!(store.scan().await.unwrap().packages, 1);
        store.probe(true).await.unwrap();
    }
}
