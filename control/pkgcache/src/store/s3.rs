//! S3-compatible object storage through `object_store`, so several cache servers share one store.
//!
//! Objects: `<prefix>/<name>/<version>/<sha>` (the package) and `<…>/<sha>.meta` (sidecar with
//! size and SHA-256). Uploads up to [`SINGLE_PUT_MAX`] are buffered and written with one PUT;
//! with `conditional_put` that PUT carries `If-None-Match: *`, so of two racing uploads of one
//! package exactly one wins and the other gets 409, across servers. Larger uploads stream as a
//! multipart upload in 8 MiB parts (bounded memory; aborted when the client goes away — a crash
//! leaves an incomplete multipart upload, invisible to readers, for a bucket lifecycle rule to
//! reap). Their completion is not conditional: two servers racing on the same large package both
//! succeed and the last one's bytes stay (for vcpkg the bytes of one ABI hash are the same
//! package, so this is harmless). Within one server the in-flight set still answers 409.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use switchyard_config::pkgcache::PkgcacheS3;

use super::s3_client::S3Client;
use super::{body_error, check_limit, ByteStream, PackageBody, PackageMeta, Totals};
use crate::error::Error;
use crate::key::{is_package_file_name, PackageKey};

/// Uploads up to this size go in one (conditional) PUT; larger ones as multipart.
pub const SINGLE_PUT_MAX: usize = 8 * 1024 * 1024;
/// Multipart part size.
const PART: usize = 8 * 1024 * 1024;
/// Parts in flight per upload (bounds memory to about PART × this).
const PARTS_IN_FLIGHT: usize = 2;

/// The S3 store.
pub struct S3Store {
    client: S3Client,
    store: Arc<AmazonS3>,
    conditional: bool,
    inflight: Arc<Mutex<HashSet<PackageKey>>>,
}

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

fn s3_err(e: object_store::Error) -> Error {
    Error::Storage(e.to_string())
}

impl S3Store {
    /// Builds the client from the config; unset values come from the `AWS_*` environment.
    pub fn new(cfg: &PkgcacheS3) -> anyhow::Result<S3Store> {
        let client = S3Client::new(cfg, "storage.s3")?;
        Ok(S3Store {
            store: client.store.clone(),
            client,
            conditional: cfg.conditional_put,
            inflight: Arc::default(),
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "{}{}",
            self.client.describe(),
            if self.conditional {
                " (conditional put)"
            } else {
                ""
            }
        )
    }

    fn path(&self, rel: &str) -> Path {
        self.client.path(rel)
    }

    fn data(&self, key: &PackageKey) -> Path {
        self.path(&key.rel_path())
    }

    fn meta(&self, key: &PackageKey) -> Path {
        self.path(&format!("{}.meta", key.rel_path()))
    }

    async fn etag(&self, key: &PackageKey, size: u64) -> Option<String> {
        let bytes = self
            .store
            .get(&self.meta(key))
            .await
            .ok()?
            .bytes()
            .await
            .ok()?;
        let meta: PackageMeta = serde_json::from_slice(&bytes).ok()?;
        (meta.size == size).then_some(meta.etag).flatten()
    }

    pub async fn head(&self, key: &PackageKey) -> Result<Option<PackageMeta>, Error> {
        let (data_path, meta_path) = (self.data(key), self.meta(key));
        let (data, etag) = tokio::join!(self.store.head(&data_path), async {
            let bytes = self.store.get(&meta_path).await.ok()?.bytes().await.ok()?;
            serde_json::from_slice::<PackageMeta>(&bytes).ok()
        });
        match data {
            Ok(m) => Ok(Some(PackageMeta {
                size: m.size,
                etag: etag.filter(|e| e.size == m.size).and_then(|e| e.etag),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(s3_err(e)),
        }
    }

    pub async fn get(&self, key: &PackageKey) -> Result<Option<(PackageMeta, PackageBody)>, Error> {
        let result = match self.store.get(&self.data(key)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(s3_err(e)),
        };
        let size = result.meta.size;
        let etag = self.etag(key, size).await;
        let stream = result
            .into_stream()
            .map(|r| r.map_err(std::io::Error::other));
        Ok(Some((
            PackageMeta { size, etag },
            PackageBody::Stream(Box::pin(stream)),
        )))
    }

    pub async fn put(
        &self,
        key: &PackageKey,
        mut body: ByteStream,
        limit: u64,
    ) -> Result<PackageMeta, Error> {
        let data = self.data(key);
        match self.store.head(&data).await {
            Ok(_) => return Err(Error::AlreadyExists),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(s3_err(e)),
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
        let mut hasher = Sha256::new();
        let mut total: u64 = 0;
        // Phase 1: buffer up to SINGLE_PUT_MAX.
        let mut buf = BytesMut::new();
        let mut ended = false;
        loop {
            match body.next().await {
                None => {
                    ended = true;
                    break;
                }
                Some(Err(e)) => return Err(body_error(e)),
                Some(Ok(chunk)) => {
                    total += chunk.len() as u64;
                    check_limit(total, limit)?;
                    hasher.update(&chunk);
                    buf.extend_from_slice(&chunk);
                    if buf.len() > SINGLE_PUT_MAX {
                        break;
                    }
                }
            }
        }
        if ended {
            let opts = PutOptions {
                mode: if self.conditional {
                    PutMode::Create
                } else {
                    PutMode::Overwrite
                },
                ..PutOptions::default()
            };
            match self
                .store
                .put_opts(&data, PutPayload::from(buf.freeze()), opts)
                .await
            {
                Ok(_) => {}
                Err(object_store::Error::AlreadyExists { .. }) => return Err(Error::AlreadyExists),
                Err(e) => return Err(Error::UploadFailed(e.to_string())),
            }
        } else {
            // Phase 2: multipart, streaming.
            let upload = self
                .store
                .put_multipart(&data)
                .await
                .map_err(|e| Error::UploadFailed(e.to_string()))?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
            w.put(buf.freeze());
            let streamed: Result<(), Error> = async {
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.map_err(body_error)?;
                    total += chunk.len() as u64;
                    check_limit(total, limit)?;
                    hasher.update(&chunk);
                    w.wait_for_capacity(PARTS_IN_FLIGHT)
                        .await
                        .map_err(|e| Error::UploadFailed(e.to_string()))?;
                    w.put(chunk);
                }
                Ok(())
            }
            .await;
            if let Err(e) = streamed {
                if let Err(abort) = w.abort().await {
                    tracing::warn!("aborting the multipart upload of {key} failed: {abort}");
                }
                return Err(e);
            }
            w.finish()
                .await
                .map_err(|e| Error::UploadFailed(e.to_string()))?;
        }
        let meta = PackageMeta {
            size: total,
            etag: Some(hex::encode(hasher.finalize())),
        };
        match serde_json::to_vec(&meta) {
            Ok(json) => {
                if let Err(e) = self
                    .store
                    .put(&self.meta(key), PutPayload::from(json))
                    .await
                {
                    tracing::warn!("cannot write the sidecar of {key}: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot encode the sidecar of {key}: {e}"),
        }
        Ok(meta)
    }

    pub async fn delete(&self, key: &PackageKey) -> Result<Option<u64>, Error> {
        let data = self.data(key);
        let size = match self.store.head(&data).await {
            Ok(m) => m.size,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(s3_err(e)),
        };
        self.store.delete(&data).await.map_err(s3_err)?;
        if let Err(e) = self.store.delete(&self.meta(key)).await {
            if !matches!(e, object_store::Error::NotFound { .. }) {
                tracing::warn!("cannot delete the sidecar of {key}: {e}");
            }
        }
        Ok(Some(size))
    }

    pub async fn scan(&self) -> Result<Totals, Error> {
        let prefix = self.client.prefix_path();
        let mut list = self.store.list(prefix.as_ref());
        let mut totals = Totals::default();
        while let Some(item) = list.next().await {
            let meta = item.map_err(s3_err)?;
            // Only `<name>/<version>/<sha>` below the prefix counts.
            let parts: Vec<_> = meta.location.parts().collect();
            let below = parts
                .len()
                .saturating_sub(prefix.as_ref().map(|p| p.parts().count()).unwrap_or(0));
            let is_pkg = below == 3
                && parts
                    .last()
                    .is_some_and(|p| is_package_file_name(p.as_ref()));
            if is_pkg {
                totals.packages += 1;
                totals.bytes += meta.size;
            }
        }
        Ok(totals)
    }

    pub async fn probe(&self, writable: bool) -> Result<(), Error> {
        let probe = async {
            if writable {
                let p = self.path(".switchyard-ready-probe");
                self.store
                    .put(&p, PutPayload::from_static(b"ok"))
                    .await
                    .map_err(|e| Error::Storage(format!("store not writable: {e}")))?;
            } else {
                let prefix = self.client.prefix_path();
                self.store
                    .list_with_delimiter(prefix.as_ref())
                    .await
                    .map_err(s3_err)?;
            }
            Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(5), probe).await {
            Ok(r) => r,
            Err(_) => Err(Error::Storage("store did not answer within 5 s".into())),
        }
    }
}
