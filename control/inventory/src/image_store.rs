//! Where image bytes live: `DATA_DIR/images/<id>` (default) or S3-compatible object storage
//! (`images.storage: s3`, object `PREFIX/<id>`), through the package cache's S3 client so the
//! project has one S3 implementation. Metadata (type, size, owner) stays in the database.
//!
//! File-system writes go to a temporary name, are synced and renamed, so a crash never leaves
//! half an image that can be served. An S3 PUT is atomic by itself.

use std::path::{Path, PathBuf};

use switchyard_config::inventory::{ImageStorage, InventoryConfig};
use switchyard_pkgcache::store::s3_client::object_store::{self, ObjectStoreExt as _, PutPayload};
use switchyard_pkgcache::store::s3_client::S3Client;
use tokio::io::AsyncWriteExt as _;

/// Why an image could not be stored, read or removed (all map to 500 at the API edge).
#[derive(Debug, thiserror::Error)]
pub enum ImageStoreError {
    #[error("image {id}: {source}")]
    Io { id: String, source: std::io::Error },
    #[error("image {id}: object storage: {source}")]
    S3 {
        id: String,
        source: object_store::Error,
    },
}

/// The configured image store.
pub enum ImageStore {
    Fs(PathBuf),
    S3(S3Client),
}

impl ImageStore {
    /// The store `cfg.images` asks for; the file-system one is `data_dir/images`.
    pub fn from_config(cfg: &InventoryConfig, data_dir: &Path) -> anyhow::Result<ImageStore> {
        Ok(match cfg.images.storage {
            ImageStorage::Filesystem => ImageStore::Fs(data_dir.join("images")),
            ImageStorage::S3 => ImageStore::S3(S3Client::new(&cfg.images.s3, "images.s3")?),
        })
    }

    /// `filesystem` or `s3`.
    pub fn backend(&self) -> &'static str {
        match self {
            ImageStore::Fs(_) => "filesystem",
            ImageStore::S3(_) => "s3",
        }
    }

    /// Where it stores, for logs (never credentials).
    pub fn describe(&self) -> String {
        match self {
            ImageStore::Fs(dir) => dir.display().to_string(),
            ImageStore::S3(c) => c.describe(),
        }
    }

    /// Stores the bytes of image `id`.
    pub async fn put(&self, id: &str, bytes: &[u8]) -> Result<(), ImageStoreError> {
        match self {
            ImageStore::Fs(dir) => {
                let io = |source| ImageStoreError::Io {
                    id: id.to_string(),
                    source,
                };
                tokio::fs::create_dir_all(dir).await.map_err(io)?;
                let tmp = dir.join(format!(".{id}.tmp"));
                let mut f = tokio::fs::File::create(&tmp).await.map_err(io)?;
                f.write_all(bytes).await.map_err(io)?;
                f.sync_all().await.map_err(io)?;
                drop(f);
                tokio::fs::rename(&tmp, dir.join(id)).await.map_err(io)
            }
            ImageStore::S3(c) => c
                .store
                .put(&c.path(id), PutPayload::from(bytes.to_vec()))
                .await
                .map(|_| ())
                .map_err(|source| ImageStoreError::S3 {
                    id: id.to_string(),
                    source,
                }),
        }
    }

    /// The bytes of image `id`, `None` when absent.
    pub async fn get(&self, id: &str) -> Result<Option<Vec<u8>>, ImageStoreError> {
        match self {
            ImageStore::Fs(dir) => match tokio::fs::read(dir.join(id)).await {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(ImageStoreError::Io {
                    id: id.to_string(),
                    source,
                }),
            },
            ImageStore::S3(c) => {
                let s3 = |source| ImageStoreError::S3 {
                    id: id.to_string(),
                    source,
                };
                match c.store.get(&c.path(id)).await {
                    Ok(r) => Ok(Some(r.bytes().await.map_err(s3)?.to_vec())),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(s3(e)),
                }
            }
        }
    }

    /// Removes image `id`; an absent image is not an error.
    pub async fn remove(&self, id: &str) -> Result<(), ImageStoreError> {
        match self {
            ImageStore::Fs(dir) => match tokio::fs::remove_file(dir.join(id)).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(source) => Err(ImageStoreError::Io {
                    id: id.to_string(),
                    source,
                }),
            },
            ImageStore::S3(c) => match c.store.delete(&c.path(id)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(source) => Err(ImageStoreError::S3 {
                    id: id.to_string(),
                    source,
                }),
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn filesystem_put_get_remove() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::from_config(&InventoryConfig::default(), dir.path()).unwrap();
        assert_eq!(store.backend(), "filesystem");
        store.put("a1", b"GIF89a").await.unwrap();
        assert_eq!(
            store.get("a1").await.unwrap().as_deref(),
            Some(&b"GIF89a"[..])
        );
        store.remove("a1").await.unwrap();
        assert_eq!(store.get("a1").await.unwrap(), None);
        store.remove("a1").await.unwrap();
    }
}
