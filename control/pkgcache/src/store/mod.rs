//! Package stores: the local file system (default) or S3-compatible object storage.
//!
//! Both keep a package as its bytes plus a small sidecar (`<sha>.meta`, JSON `{sha256, size}`)
//! holding the ETag (SHA-256 of the bytes, computed while the upload streams in). A package
//! becomes visible only when its upload completed; a package without sidecar (written by hand,
//! or a crash between the two writes) is served without ETag.

pub mod fs;
pub mod s3;
pub mod s3_client;

use std::io;
use std::pin::Pin;

use bytes::Bytes;
use futures::Stream;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::key::PackageKey;

/// A request or response body as a stream of chunks.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, io::Error>> + Send + 'static>>;

/// What is known about a stored package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageMeta {
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the bytes, lower-case hex (the ETag); `None` when the sidecar is missing.
    #[serde(rename = "sha256", skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// A package body ready to stream.
pub enum PackageBody {
    /// Small package read at once.
    Full(Bytes),
    /// Larger package, streamed in bounded chunks.
    Stream(ByteStream),
}

/// Totals found by scanning a store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub packages: u64,
    pub bytes: u64,
}

/// The configured store.
pub enum Store {
    Fs(fs::FsStore),
    S3(s3::S3Store),
}

impl Store {
    /// `filesystem` or `s3`.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Fs(_) => "filesystem",
            Store::S3(_) => "s3",
        }
    }

    /// Where it stores, for logs.
    pub fn describe(&self) -> String {
        match self {
            Store::Fs(s) => s.describe(),
            Store::S3(s) => s.describe(),
        }
    }

    /// Size and ETag of a stored package, `None` when absent.
    pub async fn head(&self, key: &PackageKey) -> Result<Option<PackageMeta>, Error> {
        match self {
            Store::Fs(s) => s.head(key).await,
            Store::S3(s) => s.head(key).await,
        }
    }

    /// The package's metadata and body, `None` when absent.
    pub async fn get(&self, key: &PackageKey) -> Result<Option<(PackageMeta, PackageBody)>, Error> {
        match self {
            Store::Fs(s) => s.get(key).await,
            Store::S3(s) => s.get(key).await,
        }
    }

    /// Stores `body` under `key` unless present (then [`Error::AlreadyExists`]). `limit` > 0
    /// bounds the size ([`Error::TooLarge`]); `expected_len` is the request's Content-Length.
    pub async fn put(
        &self,
        key: &PackageKey,
        body: ByteStream,
        limit: u64,
    ) -> Result<PackageMeta, Error> {
        match self {
            Store::Fs(s) => s.put(key, body, limit).await,
            Store::S3(s) => s.put(key, body, limit).await,
        }
    }

    /// Removes a package; returns its size, `None` when it was absent.
    pub async fn delete(&self, key: &PackageKey) -> Result<Option<u64>, Error> {
        match self {
            Store::Fs(s) => s.delete(key).await,
            Store::S3(s) => s.delete(key).await,
        }
    }

    /// Counts packages and bytes (at start).
    pub async fn scan(&self) -> Result<Totals, Error> {
        match self {
            Store::Fs(s) => s.scan().await,
            Store::S3(s) => s.scan().await,
        }
    }

    /// Ok when the store answers, and (when `writable`) accepts a write.
    pub async fn probe(&self, writable: bool) -> Result<(), Error> {
        match self {
            Store::Fs(s) => s.probe(writable).await,
            Store::S3(s) => s.probe(writable).await,
        }
    }
}

/// Counts bytes against `limit` (0 = none).
pub(crate) fn check_limit(total: u64, limit: u64) -> Result<(), Error> {
    if limit > 0 && total > limit {
        Err(Error::TooLarge(limit))
    } else {
        Ok(())
    }
}

/// A body error as [`Error::ClientAborted`].
pub(crate) fn body_error(e: io::Error) -> Error {
    Error::ClientAborted(e.to_string())
}
