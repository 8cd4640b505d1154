//! Configuration of `switchyard pkgcache`, the vcpkg HTTP binary cache server.
//!
//! Same loading rules as the server configuration: `${NAME}` expansion ([`crate::env`]), strict
//! YAML (unknown keys are errors naming their path), defaults for every missing key. An empty file
//! (or no file) is the embedded default: listen `0.0.0.0:15151`, read-write, file-system store
//! under `./data/pkgcache`, no auth (so writes only from loopback). `config/examples/pkgcache.yaml` documents every key.
//!
//! Command-line flags and `SWITCHYARD_PKGCACHE_*` environment variables override the file; that
//! merging lives in the pkgcache crate. [`validate_pkgcache`] reports semantic problems.

use serde::{Deserialize, Serialize};

use crate::listen::parse_listen;
use crate::model::LoggingConfig;
use crate::units::Size;
use crate::validate::Problem;

/// The whole `pkgcache` configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PkgcacheConfig {
    /// Listen address (`:15151`, `127.0.0.1:15151`, `[::1]:15151`; port 0 = any free port).
    pub listen: String,
    /// `read-write` (default), `read-only` (PUT/DELETE → 403) or `write-only` (GET/HEAD → 403).
    pub mode: PkgcacheMode,
    pub storage: PkgcacheStorage,
    pub auth: PkgcacheAuth,
    pub limits: PkgcacheLimits,
    pub logging: LoggingConfig,
}

impl Default for PkgcacheConfig {
    fn default() -> Self {
        PkgcacheConfig {
            listen: "0.0.0.0:15151".into(),
            mode: PkgcacheMode::ReadWrite,
            storage: PkgcacheStorage::default(),
            auth: PkgcacheAuth::default(),
            limits: PkgcacheLimits::default(),
            logging: LoggingConfig::default(),
        }
    }
}

/// Server mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PkgcacheMode {
    /// HEAD, GET, PUT, DELETE.
    #[default]
    ReadWrite,
    /// HEAD, GET; PUT and DELETE answer 403.
    ReadOnly,
    /// PUT (and DELETE); HEAD and GET answer 403 (an upload-only CI cache).
    WriteOnly,
}

impl PkgcacheMode {
    /// The name as written in the config (`read-write`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            PkgcacheMode::ReadWrite => "read-write",
            PkgcacheMode::ReadOnly => "read-only",
            PkgcacheMode::WriteOnly => "write-only",
        }
    }

    /// Parses `read-write` / `read-only` / `write-only` (also with `_`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "read-write" | "readwrite" | "rw" => Some(PkgcacheMode::ReadWrite),
            "read-only" | "readonly" | "ro" => Some(PkgcacheMode::ReadOnly),
            "write-only" | "writeonly" | "wo" => Some(PkgcacheMode::WriteOnly),
            _ => None,
        }
    }

    /// Whether PUT/DELETE are allowed.
    pub fn can_write(self) -> bool {
        self != PkgcacheMode::ReadOnly
    }

    /// Whether HEAD/GET are allowed.
    pub fn can_read(self) -> bool {
        self != PkgcacheMode::WriteOnly
    }
}

/// Which store backs the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PkgcacheBackend {
    /// A directory on the local file system (`storage.path`).
    #[default]
    Filesystem,
    /// S3-compatible object storage (`storage.s3`).
    S3,
}

/// `storage:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PkgcacheStorage {
    pub backend: PkgcacheBackend,
    /// Directory of the file-system store (created when missing).
    pub path: String,
    pub s3: PkgcacheS3,
}

impl Default for PkgcacheStorage {
    fn default() -> Self {
        PkgcacheStorage {
            backend: PkgcacheBackend::Filesystem,
            path: "./data/pkgcache".into(),
            s3: PkgcacheS3::default(),
        }
    }
}

/// `storage.s3:` — S3-compatible object storage. Unset credentials and region are taken from the
/// standard `AWS_*` environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PkgcacheS3 {
    /// `s3://BUCKET` or `s3://BUCKET/PREFIX`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Endpoint of an S3-compatible service (`http://127.0.0.1:9000`); unset = AWS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
    /// Allow a plain-HTTP endpoint (default: only when `endpoint` starts with `http://`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_http: Option<bool>,
    /// Path-style requests (`ENDPOINT/BUCKET/KEY`) instead of virtual-hosted style; default true
    /// when `endpoint` is set (most self-hosted S3 servers want it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
    /// Use `If-None-Match: *` so that of two concurrent uploads of one package exactly one
    /// wins (the other gets 409). Needs a store that supports conditional writes.
    pub conditional_put: bool,
}

impl Default for PkgcacheS3 {
    fn default() -> Self {
        PkgcacheS3 {
            url: None,
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            allow_http: None,
            path_style: None,
            conditional_put: true,
        }
    }
}

/// Endpoints authentication can cover (`auth.protect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PkgcacheScope {
    /// `/{name}/{version}/{sha}` (HEAD per `auth.anonymous_head`).
    Packages,
    /// `/health`, `/health/live`, `/health/ready`, `/health/details`.
    Health,
    /// `/metrics`.
    Metrics,
    /// `/api/openapi.json`, `/api/docs`, `/api/redoc`.
    Docs,
}

/// `auth:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PkgcacheAuth {
    /// Off by default. When on, requests to covered endpoints need a listed Bearer token or a
    /// listed Basic user; otherwise 401 with `WWW-Authenticate`.
    pub enabled: bool,
    /// Accepted `Authorization: Bearer <token>` values.
    pub tokens: Vec<String>,
    /// Accepted `Authorization: Basic` users.
    pub users: Vec<PkgcacheUser>,
    /// Let HEAD on packages through without credentials (default true: vcpkg sends its HEAD
    /// precheck without the configured auth header).
    pub anonymous_head: bool,
    /// Which endpoints auth covers (default: `[packages]`; health and metrics stay open).
    pub protect: Vec<PkgcacheScope>,
    /// Accept PUT and DELETE without credentials from any address (default false: while auth
    /// does not cover packages, writes are accepted only from loopback and answer 403 from
    /// anywhere else, so a LAN neighbour cannot replace packages that every consumer builds
    /// with).
    pub allow_anonymous_writes: bool,
}

impl Default for PkgcacheAuth {
    fn default() -> Self {
        PkgcacheAuth {
            enabled: false,
            tokens: Vec::new(),
            users: Vec::new(),
            anonymous_head: true,
            protect: vec![PkgcacheScope::Packages],
            allow_anonymous_writes: false,
        }
    }
}

/// One Basic auth user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PkgcacheUser {
    pub username: String,
    /// bcrypt hash (`$2b$…`), e.g. from `htpasswd -nbB user pass`.
    pub password_hash: String,
}

/// `limits:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PkgcacheLimits {
    /// Largest accepted package (413 above it); `0` = no limit. Default 0.
    pub max_package_size: Size,
}

impl Default for PkgcacheLimits {
    fn default() -> Self {
        PkgcacheLimits {
            max_package_size: Size::ZERO,
        }
    }
}

crate::load::strict_yaml_entry_points!(PkgcacheConfig);

/// Semantic problems of a pkgcache configuration (empty = valid).
pub fn validate_pkgcache(cfg: &PkgcacheConfig) -> Vec<Problem> {
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
    match cfg.storage.backend {
        PkgcacheBackend::Filesystem => {
            if cfg.storage.path.trim().is_empty() {
                problem("storage", "storage.path", "must not be empty".into());
            }
        }
        PkgcacheBackend::S3 => match cfg.storage.s3.url.as_deref() {
            None => problem(
                "storage",
                "storage.s3.url",
                "required with backend s3 (s3://BUCKET[/PREFIX])".into(),
            ),
            Some(url) => {
                if let Err(m) = parse_s3_url(url) {
                    problem("storage", "storage.s3.url", m);
                }
            }
        },
    }
    if let Some(ep) = &cfg.storage.s3.endpoint {
        if !(ep.starts_with("http://") || ep.starts_with("https://")) {
            problem(
                "storage",
                "storage.s3.endpoint",
                format!("{ep:?}: must start with http:// or https://"),
            );
        }
    }
    let auth = &cfg.auth;
    if auth.enabled && auth.tokens.is_empty() && auth.users.is_empty() {
        problem(
            "auth",
            "auth",
            "auth is enabled but lists no tokens and no users (nobody could authenticate)".into(),
        );
    }
    for (i, t) in auth.tokens.iter().enumerate() {
        if t.trim().is_empty() {
            problem("auth", &format!("auth.tokens[{i}]"), "empty token".into());
        }
    }
    for (i, u) in auth.users.iter().enumerate() {
        if u.username.is_empty() || u.username.contains(':') {
            problem(
                "auth",
                &format!("auth.users[{i}].username"),
                "must be non-empty and contain no ':'".into(),
            );
        }
        if !u.password_hash.starts_with("$2") || u.password_hash.len() != 60 {
            problem(
                "auth",
                &format!("auth.users[{i}].password_hash"),
                "not a bcrypt hash ($2b$…, 60 characters)".into(),
            );
        }
    }
    out
}

/// Splits `s3://BUCKET[/PREFIX]` into bucket and prefix (without slashes at the ends).
pub fn parse_s3_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{url:?}: expected s3://BUCKET[/PREFIX]"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty()
        || !bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    {
        return Err(format!(
            "{url:?}: bucket names are lowercase letters, digits, '-' and '.'"
        ));
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn empty_is_default() {
        let c = PkgcacheConfig::from_yaml_str("# nothing\n", &no_env).unwrap();
        assert_eq!(c, PkgcacheConfig::default());
        assert_eq!(c.listen, "0.0.0.0:15151");
        assert_eq!(c.mode, PkgcacheMode::ReadWrite);
        assert_eq!(c.storage.path, "./data/pkgcache");
        assert!(!c.auth.enabled);
        assert!(c.auth.anonymous_head);
        assert_eq!(c.auth.protect, vec![PkgcacheScope::Packages]);
        assert!(!c.auth.allow_anonymous_writes);
        assert!(validate_pkgcache(&c).is_empty());
    }

    #[test]
    fn unknown_keys_are_errors_with_path() {
        let err = PkgcacheConfig::from_yaml_str("auth:\n  enabeld: true\n", &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("auth.enabeld"), "{err}");
        let err = PkgcacheConfig::from_yaml_str("mode: sideways\n", &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode"), "{err}");
    }

    #[test]
    fn env_expansion_and_modes() {
        let env = |n: &str| (n == "TOKEN").then(|| "t0k".to_string());
        let c = PkgcacheConfig::from_yaml_str(
            "mode: read-only\nauth:\n  enabled: true\n  tokens: [\"${TOKEN}\"]\n",
            &env,
        )
        .unwrap();
        assert_eq!(c.mode, PkgcacheMode::ReadOnly);
        assert_eq!(c.auth.tokens, vec!["t0k".to_string()]);
        assert!(validate_pkgcache(&c).is_empty());
        assert!(PkgcacheConfig::from_yaml_str("a: ${NOPE}\n", &no_env).is_err());
        assert_eq!(
            PkgcacheMode::parse("WRITE_ONLY"),
            Some(PkgcacheMode::WriteOnly)
        );
        assert_eq!(PkgcacheMode::parse("x"), None);
    }

    #[test]
    fn validation_problems() {
        let mut c = PkgcacheConfig::default();
        c.auth.enabled = true;
        c.listen = "nope".into();
        c.storage.backend = PkgcacheBackend::S3;
        c.auth.users.push(PkgcacheUser {
            username: "a:b".into(),
            password_hash: "plain".into(),
        });
        let p = validate_pkgcache(&c);
        let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
        assert!(fields.contains(&"listen"), "{fields:?}");
        assert!(fields.contains(&"storage.s3.url"), "{fields:?}");
        assert!(fields.contains(&"auth.users[0].username"), "{fields:?}");
        assert!(
            fields.contains(&"auth.users[0].password_hash"),
            "{fields:?}"
        );
    }

    #[test]
    fn s3_urls() {
        assert_eq!(
            parse_s3_url("s3://bucket/a/b/").unwrap(),
            ("bucket".into(), "a/b".into())
        );
        assert_eq!(parse_s3_url("s3://b").unwrap(), ("b".into(), "".into()));
        assert!(parse_s3_url("http://b").is_err());
        assert!(parse_s3_url("s3://").is_err());
        assert!(parse_s3_url("s3://UPPER").is_err());
    }
}
