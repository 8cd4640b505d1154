//! The S3-compatible object storage client, built from a `storage.s3` configuration section.
//!
//! Shared by the package store ([`super::s3`]) and the inventory's image store, so there is one
//! place that turns endpoint, bucket, prefix, region and credentials into an `object_store`
//! client. Credentials are only handed to the client: [`S3Client::describe`] never shows them.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{ClientOptions, RetryConfig};
use switchyard_config::pkgcache::{parse_s3_url, PkgcacheS3};

/// The `object_store` version the client is built with, for callers issuing their own requests.
pub use object_store;

/// A client bound to one bucket and key prefix.
pub struct S3Client {
    pub store: Arc<AmazonS3>,
    pub bucket: String,
    /// Key prefix without slashes at the ends (may be empty).
    pub prefix: String,
    endpoint: String,
}

impl S3Client {
    /// Builds the client from the config; unset values come from the `AWS_*` environment.
    /// `section` names the config section in errors (`storage.s3`, `images.s3`).
    pub fn new(cfg: &PkgcacheS3, section: &str) -> anyhow::Result<S3Client> {
        let url = cfg
            .url
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("{section}.url is required with backend s3"))?;
        let (bucket, prefix) = parse_s3_url(url).map_err(anyhow::Error::msg)?;
        switchyard_service::tls::use_ring_provider();
        // Client options first: `with_client_options` replaces allow_http set before it.
        let mut b = AmazonS3Builder::from_env()
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(300)),
            )
            .with_bucket_name(&bucket);
        if let Some(ep) = &cfg.endpoint {
            b = b.with_endpoint(ep);
            b = b.with_virtual_hosted_style_request(!cfg.path_style.unwrap_or(true));
            b = b.with_allow_http(cfg.allow_http.unwrap_or(ep.starts_with("http://")));
        } else {
            if let Some(ps) = cfg.path_style {
                b = b.with_virtual_hosted_style_request(!ps);
            }
            if let Some(ah) = cfg.allow_http {
                b = b.with_allow_http(ah);
            }
        }
        if let Some(r) = &cfg.region {
            b = b.with_region(r);
        }
        if let Some(k) = &cfg.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(s) = &cfg.secret_access_key {
            b = b.with_secret_access_key(s);
        }
        if let Some(t) = &cfg.session_token {
            b = b.with_token(t);
        }
        b = b.with_conditional_put(if cfg.conditional_put {
            S3ConditionalPut::ETagMatch
        } else {
            S3ConditionalPut::Disabled
        });
        b = b.with_retry(RetryConfig {
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
            ..RetryConfig::default()
        });
        let endpoint = cfg
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .unwrap_or_else(|| "AWS".into());
        let store = b.build()?;
        Ok(S3Client {
            store: Arc::new(store),
            bucket,
            prefix,
            endpoint,
        })
    }

    /// `s3://BUCKET/PREFIX at ENDPOINT`, for logs (no credentials).
    pub fn describe(&self) -> String {
        format!("s3://{}/{} at {}", self.bucket, self.prefix, self.endpoint)
    }

    /// The object path of `rel` below the prefix.
    pub fn path(&self, rel: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(rel)
        } else {
            Path::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// The prefix as a listing root, `None` when empty.
    pub fn prefix_path(&self) -> Option<Path> {
        (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()))
    }
}
