//! `switchyard pkgcache`: a vcpkg HTTP binary cache server on the tokio control plane.
//!
//! vcpkg's `http` binary-cache provider talks to it with `HEAD`/`GET`/`PUT` on
//! `/{name}/{version}/{sha}` (see [`key`] for what a valid address is). Packages are stored on the
//! local file system ([`store::fs`], default `./data/pkgcache`) or in S3-compatible object storage
//! ([`store::s3`]); bodies stream in both directions with bounded memory, uploads become visible
//! only when complete, and a package is immutable (a second PUT is 409). Around that: server modes
//! (read-write, read-only, write-only), Bearer/Basic authentication ([`auth`]), health probes,
//! Prometheus metrics ([`metrics`]) and generated OpenAPI docs with embedded Swagger UI and ReDoc
//! ([`docs`]).
//!
//! It does not proxy to an upstream cache, expire packages, or speak vcpkg's other providers
//! (NuGet, files, GitHub Actions). It shares nothing with the data plane: it is its own router and
//! runtime, started by `switchyard pkgcache`.
//!
//! Configuration: [`switchyard_config::pkgcache::PkgcacheConfig`] from `--config`, overridden by
//! `SWITCHYARD_PKGCACHE_*` environment variables and command-line flags ([`PkgcacheArgs`]).
#![forbid(unsafe_code)]

pub mod auth;
pub mod docs;
pub mod error;
pub mod http;
pub mod metrics;
pub mod store;

pub use switchyard_pkgcache_route::{key, route};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use switchyard_config::pkgcache::{
    validate_pkgcache, PkgcacheBackend, PkgcacheConfig, PkgcacheMode,
};
use switchyard_config::LogFormat;

use crate::store::Store;

/// Command-line arguments of `switchyard pkgcache`. Each flag can also be given as the
/// environment variable named beside it; flags and variables override the config file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PkgcacheArgs {
    /// YAML configuration (every key: config/examples/pkgcache.yaml); default: built-in
    #[arg(long, short, env = "SWITCHYARD_PKGCACHE_CONFIG")]
    pub config: Option<PathBuf>,
    /// listen address, e.g. 0.0.0.0:15151, 127.0.0.1:0
    #[arg(long, env = "SWITCHYARD_PKGCACHE_LISTEN")]
    pub listen: Option<String>,
    /// file-system store directory (default ./data/pkgcache)
    #[arg(long, env = "SWITCHYARD_PKGCACHE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// read-write | read-only | write-only
    #[arg(long, env = "SWITCHYARD_PKGCACHE_MODE", value_parser = parse_mode)]
    pub mode: Option<PkgcacheMode>,
    /// serve only: PUT and DELETE answer 403
    #[arg(long, conflicts_with = "write_only")]
    pub read_only: bool,
    /// accept uploads only: HEAD and GET answer 403
    #[arg(long)]
    pub write_only: bool,
    /// store in S3-compatible object storage: s3://BUCKET[/PREFIX]
    #[arg(long, env = "SWITCHYARD_PKGCACHE_S3_URL")]
    pub s3_url: Option<String>,
    /// endpoint of the S3-compatible service, e.g. http://127.0.0.1:9000
    #[arg(long, env = "SWITCHYARD_PKGCACHE_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// file of Bearer tokens, one per line (`#` comments and blank lines ignored); enables auth.
    /// Tokens are never taken from the command line (it is visible in the process list); the
    /// variable SWITCHYARD_PKGCACHE_TOKENS (comma-separated) is the other way to pass them.
    #[arg(long, env = "SWITCHYARD_PKGCACHE_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Tokens from the environment variable [`TOKENS_ENV`], filled in by [`run`].
    #[arg(skip)]
    pub tokens_env: Option<String>,
    /// log format: text | json
    #[arg(long, env = "SWITCHYARD_PKGCACHE_LOG_FORMAT", value_parser = parse_log_format)]
    pub log_format: Option<LogFormat>,
}

/// Environment variable with comma-separated Bearer tokens.
pub const TOKENS_ENV: &str = "SWITCHYARD_PKGCACHE_TOKENS";

/// Tokens of a tokens file: one per line, `#` comments and blank lines ignored.
pub fn parse_tokens_file(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

fn read_tokens_file(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    use std::os::unix::fs::PermissionsExt as _;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the tokens file {}", path.display()))?;
    if let Ok(md) = std::fs::metadata(path) {
        if md.permissions().mode() & 0o077 != 0 {
            // Logging is not set up yet while the configuration is read.
            eprintln!(
                "warning: the tokens file {} is readable by group or others (chmod 600 it)",
                path.display()
            );
        }
    }
    let tokens = parse_tokens_file(&text);
    if tokens.is_empty() {
        bail!("the tokens file {} lists no token", path.display());
    }
    Ok(tokens)
}

fn parse_mode(s: &str) -> Result<PkgcacheMode, String> {
    PkgcacheMode::parse(s)
        .ok_or_else(|| format!("{s:?}: expected read-write, read-only or write-only"))
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("{s:?}: expected text or json")),
    }
}

/// The effective configuration: file (or built-in default), then environment and flags.
pub fn effective_config(args: &PkgcacheArgs) -> anyhow::Result<PkgcacheConfig> {
    let mut cfg = match &args.config {
        Some(path) => PkgcacheConfig::load_file(path)?,
        None => PkgcacheConfig::default(),
    };
    if let Some(l) = &args.listen {
        cfg.listen = l.clone();
    }
    if let Some(d) = &args.data_dir {
        cfg.storage.path = d.display().to_string();
        cfg.storage.backend = PkgcacheBackend::Filesystem;
    }
    if let Some(m) = args.mode {
        cfg.mode = m;
    }
    if args.read_only {
        cfg.mode = PkgcacheMode::ReadOnly;
    }
    if args.write_only {
        cfg.mode = PkgcacheMode::WriteOnly;
    }
    if let Some(u) = &args.s3_url {
        cfg.storage.backend = PkgcacheBackend::S3;
        cfg.storage.s3.url = Some(u.clone());
    }
    if let Some(e) = &args.s3_endpoint {
        cfg.storage.s3.endpoint = Some(e.clone());
    }
    let mut tokens: Vec<String> = args
        .tokens_env
        .iter()
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    if let Some(path) = &args.tokens_file {
        tokens.extend(read_tokens_file(path)?);
    }
    if !tokens.is_empty() {
        cfg.auth.enabled = true;
        cfg.auth.tokens.extend(tokens);
    }
    if let Some(f) = args.log_format {
        cfg.logging.format = f;
    }
    let problems = validate_pkgcache(&cfg);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        bail!("invalid pkgcache configuration:\n{}", list.join("\n"));
    }
    Ok(cfg)
}

/// Runs `switchyard pkgcache` until SIGINT/SIGTERM. Builds its own tokio runtime.
pub fn run(mut args: PkgcacheArgs) -> anyhow::Result<()> {
    args.tokens_env = std::env::var(TOKENS_ENV).ok();
    let cfg = effective_config(&args)?;
    let logging = cfg.logging.clone();
    switchyard_service::run("pkgcache", &logging, "", serve(cfg))?
}

async fn serve(cfg: PkgcacheConfig) -> anyhow::Result<()> {
    let store = match cfg.storage.backend {
        PkgcacheBackend::Filesystem => Store::Fs(
            store::fs::FsStore::open(std::path::Path::new(&cfg.storage.path))
                .with_context(|| format!("opening the store at {}", cfg.storage.path))?,
        ),
        PkgcacheBackend::S3 => Store::S3(store::s3::S3Store::new(&cfg.storage.s3)?),
    };
    let metrics = metrics::Metrics::new().context("registering metrics")?;
    let scan_started = Instant::now();
    match store.scan().await {
        Ok(t) => {
            metrics
                .packages
                .set(i64::try_from(t.packages).unwrap_or(i64::MAX));
            metrics
                .bytes
                .set(i64::try_from(t.bytes).unwrap_or(i64::MAX));
            tracing::info!(
                packages = t.packages,
                bytes = t.bytes,
                ms = scan_started.elapsed().as_millis() as u64,
                "store scanned"
            );
        }
        Err(e) => tracing::warn!("cannot scan the store (totals start at 0): {e}"),
    }
    let auth = auth::Auth::new(&cfg.auth);
    if auth.enabled() {
        tracing::info!(
            tokens = cfg.auth.tokens.len(),
            users = cfg.auth.users.len(),
            anonymous_head = cfg.auth.anonymous_head,
            protect = ?cfg.auth.protect,
            "auth on"
        );
    } else {
        tracing::info!("auth off: anyone who reaches the port can read");
    }
    let writers = auth.writers(cfg.mode.can_write());
    let anyone = cfg.mode.can_write()
        && cfg.auth.allow_anonymous_writes
        && !auth.required("PUT", Some(route::Scope::Packages));
    if anyone {
        tracing::warn!(writers, "who may write packages: anyone can replace them");
    } else {
        tracing::info!(writers, "who may write packages");
    }
    let listener = switchyard_service::bind(&cfg.listen).await?;
    let local: SocketAddr = listener.local_addr()?;
    tracing::info!(
        listen = %local,
        backend = store.backend(),
        store = %store.describe(),
        mode = cfg.mode.as_str(),
        max_package_size = cfg.limits.max_package_size.0,
        "pkgcache listening on http://{local}"
    );
    let state = Arc::new(http::AppState {
        store,
        mode: cfg.mode,
        auth,
        metrics,
        limit: cfg.limits.max_package_size.0,
        started: Instant::now(),
    });
    // The peer's address decides whether a write without credentials is accepted.
    let service = http::router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(switchyard_service::shutdown_signal())
        .await
        .context("serving")?;
    tracing::info!("pkgcache stopped");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_defaults() {
        let args = PkgcacheArgs {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some("/tmp/x".into()),
            read_only: true,
            tokens_env: Some("a, ,b".into()),
            ..PkgcacheArgs::default()
        };
        let cfg = effective_config(&args).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:0");
        assert_eq!(cfg.storage.path, "/tmp/x");
        assert_eq!(cfg.mode, PkgcacheMode::ReadOnly);
        assert!(cfg.auth.enabled);
        assert_eq!(cfg.auth.tokens, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(
            parse_tokens_file("# ci\n  t1 \n\nt2\n"),
            vec!["t1".to_string(), "t2".to_string()]
        );
        let bad = PkgcacheArgs {
            listen: Some("nope".into()),
            ..PkgcacheArgs::default()
        };
        assert!(effective_config(&bad).is_err());
    }
}
