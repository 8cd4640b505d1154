//! Configuration of `switchyard inventory`, the multi-user inventory service.
//!
//! Same loading rules as the server configuration: `${NAME}` expansion ([`crate::env`]), strict
//! YAML (unknown keys are errors naming their path), defaults for every missing key. An empty file
//! (or no file) is the embedded default: listen `0.0.0.0:3000`, data directory `./data/inventory`
//! holding the SQLite database, the generated session secret and the images.
//! `config/examples/inventory.yaml` documents every key.
//!
//! Command-line flags and `SWITCHYARD_INVENTORY_*` / `DATABASE_URL` / `AUTH_SECRET` environment
//! variables override the file; that merging lives in the inventory crate.
//! [`validate_inventory`] reports semantic problems.

use serde::{Deserialize, Serialize};

use crate::listen::parse_listen;
use crate::model::LoggingConfig;
use crate::pkgcache::{parse_s3_url, PkgcacheS3};
use crate::units::{Duration, Size};
use crate::validate::Problem;

/// The whole `inventory` configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InventoryConfig {
    /// Listen address (`:3000`, `127.0.0.1:3000`, `[::1]:3000`; port 0 = any free port).
    pub listen: String,
    /// Directory for the SQLite database, the generated session secret and images.
    pub data_dir: String,
    pub database: InventoryDatabase,
    pub session: InventorySession,
    pub limits: InventoryLimits,
    pub images: InventoryImages,
    /// Reverse proxies (CIDRs) whose `X-Forwarded-For` names the client for the per-IP limits.
    /// Default none: the socket peer is the client, and the header is ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    pub logging: LoggingConfig,
}

impl Default for InventoryConfig {
    fn default() -> Self {
        InventoryConfig {
            listen: "0.0.0.0:3000".into(),
            data_dir: "./data/inventory".into(),
            database: InventoryDatabase::default(),
            session: InventorySession::default(),
            limits: InventoryLimits::default(),
            images: InventoryImages::default(),
            trusted_proxies: Vec::new(),
            logging: LoggingConfig::default(),
        }
    }
}

/// `database:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct InventoryDatabase {
    /// `sqlite://PATH` or `postgres://USER:PASS@HOST/DB`; unset = `sqlite://DATA_DIR/inventory.db`.
    /// The `DATABASE_URL` environment variable overrides it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// `session:` — the encrypted session cookie.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InventorySession {
    /// Secret the cookie key is derived from (at least 32 characters). The `AUTH_SECRET`
    /// environment variable overrides it; with neither, a secret is generated once and kept in
    /// `DATA_DIR/auth_secret` (mode 0600).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// A session unused for this long expires; every authenticated request renews it.
    /// Default 24h.
    pub idle_timeout: Duration,
    /// A session expires this long after sign-in however much it is used. Default 30d.
    pub max_lifetime: Duration,
    /// Mark cookies `Secure`; default: only when the service sees TLS (`X-Forwarded-Proto:
    /// https` from a reverse proxy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_cookies: Option<bool>,
}

impl Default for InventorySession {
    fn default() -> Self {
        InventorySession {
            secret: None,
            idle_timeout: Duration::from_secs(24 * 3600),
            max_lifetime: Duration::from_secs(30 * 24 * 3600),
            secure_cookies: None,
        }
    }
}

/// `limits:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InventoryLimits {
    /// Largest accepted image upload (413 above it). Default 10MiB.
    pub max_image_size: Size,
    /// Largest JSON or form request body (413 above it). Default 1MiB.
    pub max_body_size: Size,
    /// Failed sign-ins from one IP address within `window` before 429. Default 20.
    pub signin_failures_per_ip: u32,
    /// Failed sign-ins for one account from one client IP within `window` before 429 (per
    /// account and client, so nobody can lock an account out for everyone). Default 5.
    pub signin_failures_per_account: u32,
    /// Registration attempts from one IP address within `window` before 429. Default 20.
    pub registrations_per_ip: u32,
    /// The sliding window of the three limits above. Default 15m.
    pub window: Duration,
}

impl Default for InventoryLimits {
    fn default() -> Self {
        InventoryLimits {
            max_image_size: Size(10 * 1024 * 1024),
            max_body_size: Size(1024 * 1024),
            signin_failures_per_ip: 20,
            signin_failures_per_account: 5,
            registrations_per_ip: 20,
            window: Duration::from_secs(15 * 60),
        }
    }
}

/// Where image bytes are kept (`images.storage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageStorage {
    /// `DATA_DIR/images/<id>`.
    #[default]
    Filesystem,
    /// S3-compatible object storage (`images.s3`), object `<prefix>/<id>`.
    S3,
}

/// `images:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct InventoryImages {
    pub storage: ImageStorage,
    /// The same keys as the package cache's `storage.s3` (one client serves both);
    /// `conditional_put` does not apply (image ids are unique).
    pub s3: PkgcacheS3,
}

crate::load::strict_yaml_entry_points!(InventoryConfig);

/// Semantic problems of an inventory configuration (empty = valid).
pub fn validate_inventory(cfg: &InventoryConfig) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut problem = |section: &str, field: &str, message: String| {
        out.push(Problem {
            section: section.to_string(),
            field: field.to_string(),
            message,
        });
    };
    if let Err(e) = parse_listen(&cfg.listen) {
        problem("listen", "listen", e.to_string());
    }
    if cfg.data_dir.trim().is_empty() {
        problem("data_dir", "data_dir", "must not be empty".into());
    }
    if !crate::model::LOG_LEVELS.contains(&cfg.logging.level.as_str()) {
        problem(
            "logging",
            "logging.level",
            format!(
                "unknown level {:?} (one of {})",
                cfg.logging.level,
                crate::model::LOG_LEVELS.join(", ")
            ),
        );
    }
    if let Some(url) = &cfg.database.url {
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            problem(
                "database",
                "database.url",
                format!("{url:?}: expected sqlite://PATH or postgres://…"),
            );
        }
    }
    if let Some(s) = &cfg.session.secret {
        if s.len() < 32 {
            problem(
                "session",
                "session.secret",
                "must be at least 32 characters".into(),
            );
        }
    }
    if cfg.session.idle_timeout.0.is_zero() {
        problem("session", "session.idle_timeout", "must be positive".into());
    }
    if cfg.session.max_lifetime.0 < cfg.session.idle_timeout.0 {
        problem(
            "session",
            "session.max_lifetime",
            "must be at least session.idle_timeout".into(),
        );
    }
    let l = &cfg.limits;
    if l.max_image_size.0 == 0 {
        problem("limits", "limits.max_image_size", "must be positive".into());
    }
    if l.max_body_size.0 < 1024 {
        problem(
            "limits",
            "limits.max_body_size",
            "must be at least 1KiB".into(),
        );
    }
    for (name, v) in [
        ("signin_failures_per_ip", l.signin_failures_per_ip),
        ("signin_failures_per_account", l.signin_failures_per_account),
        ("registrations_per_ip", l.registrations_per_ip),
    ] {
        if v == 0 {
            problem(
                "limits",
                &format!("limits.{name}"),
                "must be at least 1".into(),
            );
        }
    }
    if l.window.0.is_zero() {
        problem("limits", "limits.window", "must be positive".into());
    }
    let s3 = &cfg.images.s3;
    if cfg.images.storage == ImageStorage::S3 {
        match s3.url.as_deref() {
            None => problem(
                "images",
                "images.s3.url",
                "required with storage s3 (s3://BUCKET[/PREFIX])".into(),
            ),
            Some(url) => {
                if let Err(m) = parse_s3_url(url) {
                    problem("images", "images.s3.url", m);
                }
            }
        }
    }
    if let Some(ep) = &s3.endpoint {
        if !(ep.starts_with("http://") || ep.starts_with("https://")) {
            problem(
                "images",
                "images.s3.endpoint",
                format!("{ep:?}: must start with http:// or https://"),
            );
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default_and_defaults_are_valid() {
        let cfg = InventoryConfig::from_yaml_str("# nothing\n", &|_| None).unwrap();
        assert_eq!(cfg, InventoryConfig::default());
        assert!(validate_inventory(&cfg).is_empty());
        assert_eq!(cfg.session.idle_timeout.0.as_secs(), 86400);
    }

    #[test]
    fn trusted_proxies_are_cidrs() {
        let cfg = InventoryConfig::from_yaml_str(
            "trusted_proxies: [\"10.0.0.0/8\", \"::1/128\"]\n",
            &|_| None,
        )
        .unwrap();
        assert_eq!(cfg.trusted_proxies.len(), 2);
        assert!(InventoryConfig::from_yaml_str("trusted_proxies: [nope]\n", &|_| None).is_err());
    }

    #[test]
    fn problems_are_named() {
        let cfg = InventoryConfig::from_yaml_str(
            "listen: nope\ndatabase: {url: 'mysql://x'}\nsession: {secret: short}\n",
            &|_| None,
        )
        .unwrap();
        let fields: Vec<String> = validate_inventory(&cfg)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(fields, ["listen", "database.url", "session.secret"]);
        assert!(InventoryConfig::from_yaml_str("bogus: 1\n", &|_| None).is_err());
    }

    #[test]
    fn image_storage_s3_needs_a_url_and_expands_credentials() {
        let cfg = InventoryConfig::from_yaml_str("images: {storage: s3}\n", &|_| None).unwrap();
        let fields: Vec<String> = validate_inventory(&cfg)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(fields, ["images.s3.url"]);
        let env = |k: &str| (k == "IMG_SECRET").then(|| "s3cret".to_string());
        let cfg = InventoryConfig::from_yaml_str(
            "images:\n  storage: s3\n  s3:\n    url: s3://bucket/img\n    endpoint: 'ftp://x'\n    secret_access_key: ${IMG_SECRET}\n",
            &env,
        )
        .unwrap();
        assert_eq!(cfg.images.s3.secret_access_key.as_deref(), Some("s3cret"));
        let fields: Vec<String> = validate_inventory(&cfg)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(fields, ["images.s3.endpoint"]);
        assert_eq!(
            InventoryConfig::default().images.storage,
            ImageStorage::Filesystem
        );
    }
}
