//! Opening a service's database: SQLite or PostgreSQL, chosen by the URL, through sqlx's `Any`
//! driver, so one query set and one migration directory serve both engines. Used by the
//! inventory service and the server's mesh registry.
//!
//! Decision: SQLite runs in WAL mode with foreign keys on and a busy timeout; the caller's
//! embedded migrations run at open. Timestamps are stored as ISO-8601 UTC text of fixed width
//! ([`now_iso`]), which sorts lexically on both engines.
#![forbid(unsafe_code)]

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;

/// Errors opening a database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("connecting to {url}: {source}")]
    Connect { url: String, source: sqlx::Error },
    #[error("running migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("preparing the database: {0}")]
    Setup(#[from] sqlx::Error),
}

/// Which engine a pool talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    /// The engine a URL names: `sqlite:` URLs are SQLite, anything else PostgreSQL.
    pub fn of(url: &str) -> Self {
        if url.starts_with("sqlite:") {
            Engine::Sqlite
        } else {
            Engine::Postgres
        }
    }
}

/// `url` with any password replaced by `***` (for logs).
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The URL of a SQLite file, created when missing.
pub fn sqlite_url(path: &std::path::Path) -> String {
    format!("sqlite://{}?mode=rwc", path.display())
}

/// Connect, set SQLite pragmas, run `migrator`.
pub async fn open(
    url: &str,
    migrator: &sqlx::migrate::Migrator,
) -> Result<(AnyPool, Engine), DbError> {
    sqlx::any::install_default_drivers();
    let engine = Engine::of(url);
    let pool = AnyPoolOptions::new()
        .max_connections(if engine == Engine::Sqlite { 8 } else { 16 })
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if engine == Engine::Sqlite {
                    sqlx::query("PRAGMA foreign_keys = ON")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("PRAGMA busy_timeout = 10000")
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await
        .map_err(|source| DbError::Connect {
            url: redact(url),
            source,
        })?;
    if engine == Engine::Sqlite {
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await?;
    }
    migrator.run(&pool).await?;
    Ok((pool, engine))
}

/// A transaction for work that reads before it writes. On SQLite it is `BEGIN IMMEDIATE`: it
/// takes the write lock at once (waiting for it under the busy timeout), because a deferred
/// transaction that has read cannot upgrade to a writer once another connection committed —
/// SQLite answers that with SQLITE_BUSY without consulting the busy timeout. PostgreSQL's
/// row locks need no such care.
pub async fn begin_write(
    pool: &AnyPool,
    engine: Engine,
) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
    match engine {
        Engine::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
        Engine::Postgres => pool.begin().await,
    }
}

/// Is this a unique-constraint violation?
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

/// A time as stored: `2026-01-02T03:04:05.678Z`.
pub fn iso(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Now as stored (see [`iso`]).
pub fn now_iso() -> String {
    iso(Utc::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("sqlite://./x.db"), "sqlite://./x.db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn engine_follows_the_scheme() {
        assert_eq!(Engine::of("sqlite:///tmp/x.db"), Engine::Sqlite);
        assert_eq!(Engine::of("postgres://h/db"), Engine::Postgres);
    }

    #[test]
    fn stored_times_have_fixed_width_and_sort() {
        let a = iso(DateTime::from_timestamp(1_700_000_000, 5_000_000).unwrap_or_default());
        let b = iso(DateTime::from_timestamp(1_700_000_001, 0).unwrap_or_default());
        assert_eq!(a, "2023-11-14T22:13:20.005Z");
        assert_eq!(a.len(), b.len());
        assert!(a < b);
    }
}
