//! `switchyard inventory`: a multi-user inventory service on the tokio control plane.
//!
//! Users register and sign in ([`auth`]); the session is an encrypted JWT cookie (JWE `dir` +
//! `A256GCM`, [`session`]) that expires after inactivity and is renewed on use, with CSRF
//! double-submit tokens on every state-changing request and bruteforce limits ([`limiter`]).
//! Each user manages their own items, categories and locations ([`resources`]); the first user
//! to register is `ADMIN` and sees everyone's data. Storage is SQLite under the data directory by
//! default or PostgreSQL by URL, through one portable query set ([`db`]). Validation and query
//! building are runtime-free ([`validate`]).
//!
//! Item images ([`images`]) are sniffed, size-limited and stored under the data directory or on
//! S3-compatible storage ([`image_store`], with the package cache's S3 client).
//!
//! Export/import of a user's data (JSON format version 1, CSV items) is [`transfer`].
//!
//! The web UI ([`ui`]) is one embedded page at `/` over the same JSON API.
//!
//! It shares nothing with the data plane: its own router and runtime, started by
//! `switchyard inventory`.
//!
//! Configuration: [`switchyard_config::inventory::InventoryConfig`] from `--config`, overridden by
//! environment variables and flags ([`InventoryArgs`]).
#![forbid(unsafe_code)]

pub mod auth;
pub mod csv;
pub mod db;
pub mod error;
pub mod http;
pub mod image_store;
pub mod images;
pub mod limiter;
pub mod resources;
pub mod session;
pub mod transfer;
pub mod ui;
pub mod validate;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use switchyard_config::inventory::{validate_inventory, InventoryConfig};

/// Command-line arguments of `switchyard inventory`. Flags and the environment variables named
/// beside them override the config file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct InventoryArgs {
    /// YAML configuration (every key: config/examples/inventory.yaml); default: built-in
    #[arg(long, short, env = "SWITCHYARD_INVENTORY_CONFIG")]
    pub config: Option<PathBuf>,
    /// listen address, e.g. 0.0.0.0:3000, 127.0.0.1:0
    #[arg(long, env = "SWITCHYARD_INVENTORY_LISTEN")]
    pub listen: Option<String>,
    /// data directory: SQLite database, generated session secret (default ./data/inventory)
    #[arg(long, env = "SWITCHYARD_INVENTORY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// database URL: sqlite://PATH or postgres://USER:PASS@HOST/DB
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// file holding the secret the session key is derived from (at least 32 characters;
    /// surrounding whitespace ignored). The secret itself is never taken from the command line
    /// (it is visible in the process list): this file, the variable AUTH_SECRET, or
    /// `session.secret` in the config file.
    #[arg(long, env = "AUTH_SECRET_FILE")]
    pub auth_secret_file: Option<PathBuf>,
    /// The secret from the environment variable [`AUTH_SECRET_ENV`], filled in by [`run`].
    #[arg(skip)]
    pub auth_secret_env: Option<String>,
}

/// Environment variable holding the session secret.
pub const AUTH_SECRET_ENV: &str = "AUTH_SECRET";

/// The effective configuration: file (or built-in default), then environment and flags.
pub fn effective_config(args: &InventoryArgs) -> anyhow::Result<InventoryConfig> {
    let mut cfg = match &args.config {
        Some(path) => InventoryConfig::load_file(path)?,
        None => InventoryConfig::default(),
    };
    if let Some(l) = &args.listen {
        cfg.listen = l.clone();
    }
    if let Some(d) = &args.data_dir {
        cfg.data_dir = d.display().to_string();
    }
    if let Some(u) = args.database_url.as_ref().filter(|u| !u.trim().is_empty()) {
        cfg.database.url = Some(u.trim().to_string());
    }
    if let Some(s) = args.auth_secret_env.as_ref().filter(|s| !s.is_empty()) {
        cfg.session.secret = Some(s.clone());
    }
    if let Some(path) = &args.auth_secret_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the secret file {}", path.display()))?;
        cfg.session.secret = Some(text.trim().to_string());
    }
    let problems = validate_inventory(&cfg);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        bail!("invalid inventory configuration:\n{}", list.join("\n"));
    }
    Ok(cfg)
}

/// Runs `switchyard inventory` until SIGINT/SIGTERM. Builds its own tokio runtime.
pub fn run(mut args: InventoryArgs) -> anyhow::Result<()> {
    args.auth_secret_env = std::env::var(AUTH_SECRET_ENV).ok();
    let cfg = effective_config(&args)?;
    let logging = cfg.logging.clone();
    switchyard_service::run("inventory", &logging, ",sqlx=warn", serve(cfg))?
}

/// The session secret: configured (`--auth-secret-file`, `AUTH_SECRET`, `session.secret`), else read from
/// `DATA_DIR/auth_secret`, else generated there once with mode 0600.
pub fn load_secret(cfg: &InventoryConfig, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(s) = &cfg.session.secret {
        tracing::info!(
            "session key derived from the configured secret (file, AUTH_SECRET or session.secret)"
        );
        return Ok(s.clone());
    }
    let path = data_dir.join("auth_secret");
    match std::fs::read_to_string(&path) {
        Ok(s) if s.trim().len() >= 32 => {
            tracing::info!(path = %path.display(), "session key derived from the stored secret");
            return Ok(s.trim().to_string());
        }
        Ok(_) => bail!(
            "{} is shorter than 32 characters; remove it to have a new one generated",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let secret = session::generate_secret().context("generating the session secret")?;
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?
    };
    f.write_all(secret.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    tracing::warn!(
        path = %path.display(),
        "AUTH_SECRET is not set: generated a session secret and stored it (mode 0600); \
         set AUTH_SECRET to share sessions between instances"
    );
    Ok(secret)
}

async fn serve(cfg: InventoryConfig) -> anyhow::Result<()> {
    let data_dir = PathBuf::from(&cfg.data_dir);
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let url = match &cfg.database.url {
        Some(u) => u.clone(),
        None => format!(
            "sqlite://{}?mode=rwc",
            data_dir.join("inventory.db").display()
        ),
    };
    let (pool, engine) = db::open(&url).await?;
    tracing::info!(database = %db::redact(&url), ?engine, "database ready (migrations applied)");
    let secret = load_secret(&cfg, &data_dir)?;
    let keys = session::Keys::from_secret(secret.as_bytes());
    let dummy_hash = tokio::task::spawn_blocking(|| {
        bcrypt::hash("switchyard-inventory-dummy", auth::BCRYPT_COST)
    })
    .await
    .context("hashing task")?
    .context("bcrypt")?;
    let images = image_store::ImageStore::from_config(&cfg, &data_dir)?;
    if let image_store::ImageStore::Fs(dir) = &images {
        clean_image_dir(dir)?;
    }
    tracing::info!(
        backend = images.backend(),
        location = %images.describe(),
        "image storage ready"
    );
    let listener = switchyard_service::bind(&cfg.listen).await?;
    let local: SocketAddr = listener.local_addr()?;
    tracing::info!(
        listen = %local,
        data_dir = %data_dir.display(),
        idle_timeout = ?cfg.session.idle_timeout.0,
        "inventory listening on http://{local}"
    );
    let state = Arc::new(http::AppState {
        pool,
        engine,
        data_dir,
        images,
        keys,
        cfg,
        limiter: parking_lot::Mutex::new(limiter::Limiter::default()),
        dummy_hash,
    });
    axum::serve(
        listener,
        http::router(state.clone()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(switchyard_service::shutdown_signal())
    .await
    .context("serving")?;
    state.pool.close().await;
    tracing::info!("inventory stopped");
    Ok(())
}

/// Create `DATA_DIR/images` and drop temporary files a crash may have left there.
fn clean_image_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let temporary = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.') && n.ends_with(".tmp"));
        if temporary {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "cannot remove a leftover upload: {e}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_defaults() {
        let args = InventoryArgs {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some("/tmp/x".into()),
            database_url: Some("postgres://u:p@h/db".into()),
            ..InventoryArgs::default()
        };
        let cfg = effective_config(&args).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:0");
        assert_eq!(cfg.data_dir, "/tmp/x");
        assert_eq!(cfg.database.url.as_deref(), Some("postgres://u:p@h/db"));
        let bad = InventoryArgs {
            auth_secret_env: Some("short".into()),
            ..InventoryArgs::default()
        };
        assert!(effective_config(&bad).is_err());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, format!("{}\n", "s".repeat(40))).unwrap();
        let from_file = InventoryArgs {
            auth_secret_file: Some(file),
            auth_secret_env: Some("e".repeat(40)),
            ..InventoryArgs::default()
        };
        let cfg = effective_config(&from_file).unwrap();
        assert_eq!(
            cfg.session.secret,
            Some("s".repeat(40)),
            "the file wins over the variable"
        );
    }

    #[test]
    fn secret_is_generated_once_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let cfg = InventoryConfig::default();
        let a = load_secret(&cfg, dir.path()).unwrap();
        let b = load_secret(&cfg, dir.path()).unwrap();
        assert_eq!(a, b);
        let mode = std::fs::metadata(dir.path().join("auth_secret"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            db::redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(db::redact("sqlite://./x.db"), "sqlite://./x.db");
    }
}
