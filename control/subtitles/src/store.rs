//! Persistence in one SQLite file under the data directory (WAL): jobs (status, progress,
//! count, error, result — never a key) and the translation cache keyed by (video, source
//! language as requested, target language, provider, model) — see [`CacheKey`]. At start, jobs a
//! previous run left `pending` or `processing` become `failed` with the reason.

use std::path::Path;
use std::str::FromStr as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::error::Error;

/// A translated (or source) segment as the API gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub start: f64,
    pub end: f64,
    pub text: String,
}

/// The four job states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Pending,
    Processing,
    Completed,
    Failed,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Processing => "processing",
            JobStatus::Completed => "completed",
            JobStatus::Failed => "failed",
        }
    }
}

/// A job row as `GET /api/status/{job_id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    pub job_id: String,
    pub status: String,
    pub progress: f64,
    pub subtitles_count: i64,
    pub error: Option<String>,
    pub error_code: Option<String>,
    pub video_url: String,
    pub target_language: String,
    pub source_language: Option<String>,
    pub tier: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A cached translation.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedTranslation {
    pub source_language: String,
    pub subtitles: Vec<Segment>,
}

/// The reason written into jobs a restart interrupted.
pub const INTERRUPTED: &str = "interrupted: the service restarted while the job was running";

#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    progress REAL NOT NULL DEFAULT 0,
    subtitles_count INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    error_code TEXT,
    video_url TEXT NOT NULL,
    target_language TEXT NOT NULL,
    source_language TEXT,
    tier INTEGER NOT NULL,
    result TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
-- the cache of earlier versions was keyed without the provider: any caller's endpoint could
-- have filled it, so it is dropped rather than trusted
DROP TABLE IF EXISTS translations;
CREATE TABLE IF NOT EXISTS translation_cache (
    video_url TEXT NOT NULL,
    source_language TEXT NOT NULL,
    target_language TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    detected_source_language TEXT NOT NULL,
    subtitles TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (video_url, source_language, target_language, provider, model)
);
";

/// Which translation a cache entry holds. `provider` identifies the endpoint that produced it
/// ([`provider_identity`](crate::providers::provider_identity), a digest, never a key or URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheKey<'a> {
    pub video_url: &'a str,
    /// As requested (`auto` when not given).
    pub source_language: &'a str,
    pub target_language: &'a str,
    pub provider: &'a str,
    pub model: &'a str,
}

impl Store {
    /// Opens (creating) `DIR/subtitles.db`, creates the schema and fails interrupted jobs.
    pub async fn open(data_dir: &Path) -> Result<Store, sqlx::Error> {
        let url = format!("sqlite://{}", data_dir.join("subtitles.db").display());
        let opts = SqliteConnectOptions::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        let interrupted = sqlx::query(
            "UPDATE jobs SET status = 'failed', error = ?, error_code = 'INTERNAL_ERROR', updated_at = ? \
             WHERE status IN ('pending', 'processing')",
        )
        .bind(INTERRUPTED)
        .bind(now())
        .execute(&pool)
        .await?
        .rows_affected();
        if interrupted > 0 {
            tracing::warn!(
                jobs = interrupted,
                "jobs interrupted by the last stop marked failed"
            );
        }
        Ok(Store { pool })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub async fn create_job(
        &self,
        job_id: &str,
        video_url: &str,
        target_language: &str,
        source_language: Option<&str>,
        tier: u8,
    ) -> Result<(), Error> {
        let t = now();
        sqlx::query(
            "INSERT INTO jobs (job_id, status, video_url, target_language, source_language, tier, created_at, updated_at) \
             VALUES (?, 'pending', ?, ?, ?, ?, ?, ?)",
        )
        .bind(job_id)
        .bind(video_url)
        .bind(target_language)
        .bind(source_language)
        .bind(i64::from(tier))
        .bind(t)
        .bind(t)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Moves a job to `processing` (or keeps it there) with its progress and count so far.
    pub async fn set_progress(
        &self,
        job_id: &str,
        progress: f64,
        subtitles_count: usize,
    ) -> Result<(), Error> {
        sqlx::query(
            "UPDATE jobs SET status = 'processing', progress = ?, subtitles_count = ?, updated_at = ? \
             WHERE job_id = ? AND status IN ('pending', 'processing')",
        )
        .bind(progress.clamp(0.0, 100.0))
        .bind(subtitles_count as i64)
        .bind(now())
        .bind(job_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn complete(
        &self,
        job_id: &str,
        source_language: &str,
        subtitles: &[Segment],
    ) -> Result<(), Error> {
        let result = serde_json::to_string(subtitles).unwrap_or_else(|_| "[]".into());
        sqlx::query(
            "UPDATE jobs SET status = 'completed', progress = 100, subtitles_count = ?, error = NULL, \
             source_language = COALESCE(source_language, ?), result = ?, updated_at = ? \
             WHERE job_id = ? AND status IN ('pending', 'processing')",
        )
        .bind(subtitles.len() as i64)
        .bind(source_language)
        .bind(result)
        .bind(now())
        .bind(job_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn fail(&self, job_id: &str, code: &str, message: &str) -> Result<(), Error> {
        sqlx::query(
            "UPDATE jobs SET status = 'failed', error = ?, error_code = ?, updated_at = ? \
             WHERE job_id = ? AND status IN ('pending', 'processing')",
        )
        .bind(message)
        .bind(code)
        .bind(now())
        .bind(job_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn job(&self, job_id: &str) -> Result<Option<JobView>, Error> {
        let row = sqlx::query(
            "SELECT job_id, status, progress, subtitles_count, error, error_code, video_url, \
             target_language, source_language, tier, created_at, updated_at FROM jobs WHERE job_id = ?",
        )
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        Ok(Some(JobView {
            job_id: r.try_get("job_id")?,
            status: r.try_get("status")?,
            progress: r.try_get("progress")?,
            subtitles_count: r.try_get("subtitles_count")?,
            error: r.try_get("error")?,
            error_code: r.try_get("error_code")?,
            video_url: r.try_get("video_url")?,
            target_language: r.try_get("target_language")?,
            source_language: r.try_get("source_language")?,
            tier: r.try_get("tier")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
        }))
    }

    /// The result of a completed job.
    pub async fn job_result(&self, job_id: &str) -> Result<Option<Vec<Segment>>, Error> {
        let row = sqlx::query("SELECT result FROM jobs WHERE job_id = ? AND status = 'completed'")
            .bind(job_id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(r) = row else { return Ok(None) };
        let text: Option<String> = r.try_get("result")?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    }

    pub async fn cached(&self, key: &CacheKey<'_>) -> Result<Option<CachedTranslation>, Error> {
        let row = sqlx::query(
            "SELECT detected_source_language, subtitles FROM translation_cache \
             WHERE video_url = ? AND source_language = ? AND target_language = ? \
             AND provider = ? AND model = ?",
        )
        .bind(key.video_url)
        .bind(key.source_language)
        .bind(key.target_language)
        .bind(key.provider)
        .bind(key.model)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        let text: String = r.try_get("subtitles")?;
        let Ok(subtitles) = serde_json::from_str(&text) else {
            return Ok(None);
        };
        Ok(Some(CachedTranslation {
            source_language: r.try_get("detected_source_language")?,
            subtitles,
        }))
    }

    pub async fn store_translation(
        &self,
        key: &CacheKey<'_>,
        entry: &CachedTranslation,
    ) -> Result<(), Error> {
        let text = serde_json::to_string(&entry.subtitles).unwrap_or_else(|_| "[]".into());
        sqlx::query(
            "INSERT INTO translation_cache (video_url, source_language, target_language, \
             provider, model, detected_source_language, subtitles, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (video_url, source_language, target_language, provider, model) \
             DO UPDATE SET detected_source_language = excluded.detected_source_language, \
             subtitles = excluded.subtitles, created_at = excluded.created_at",
        )
        .bind(key.video_url)
        .bind(key.source_language)
        .bind(key.target_language)
        .bind(key.provider)
        .bind(key.model)
        .bind(&entry.source_language)
        .bind(text)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_and_cache_survive_reopen_and_interrupted_jobs_fail() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        store
            .create_job("a", "https://v/1", "es", None, 3)
            .await
            .unwrap();
        store
            .create_job("b", "https://v/2", "es", Some("en"), 1)
            .await
            .unwrap();
        store.set_progress("a", 40.0, 3).await.unwrap();
        let seg = Segment {
            start: 1.0,
            end: 2.5,
            text: "hola".into(),
        };
        store
            .complete("b", "en", std::slice::from_ref(&seg))
            .await
            .unwrap();
        let entry = CachedTranslation {
            source_language: "en".into(),
            subtitles: vec![seg.clone()],
        };
        let key = CacheKey {
            video_url: "https://v/2",
            source_language: "auto",
            target_language: "es",
            provider: "p1",
            model: "m",
        };
        store.store_translation(&key, &entry).await.unwrap();
        let a = store.job("a").await.unwrap().unwrap();
        assert_eq!(
            (a.status.as_str(), a.progress, a.subtitles_count),
            ("processing", 40.0, 3)
        );
        store.close().await;

        let store = Store::open(dir.path()).await.unwrap();
        let a = store.job("a").await.unwrap().unwrap();
        assert_eq!(a.status, "failed");
        assert_eq!(a.error.as_deref(), Some(INTERRUPTED));
        let b = store.job("b").await.unwrap().unwrap();
        assert_eq!(
            (b.status.as_str(), b.progress, b.subtitles_count),
            ("completed", 100.0, 1)
        );
        assert_eq!(store.job_result("b").await.unwrap().unwrap(), vec![seg]);
        assert_eq!(store.cached(&key).await.unwrap(), Some(entry));
        let other_model = CacheKey {
            model: "other",
            ..key
        };
        assert_eq!(store.cached(&other_model).await.unwrap(), None);
        let other_provider = CacheKey {
            provider: "p2",
            ..key
        };
        assert_eq!(store.cached(&other_provider).await.unwrap(), None);
        assert!(store.job("zzz").await.unwrap().is_none());
        // a failed job stays failed, a completed one completed
        store.set_progress("a", 50.0, 1).await.unwrap();
        store.complete("a", "en", &[]).await.unwrap();
        assert_eq!(store.job("a").await.unwrap().unwrap().status, "failed");
        store.fail("b", "CANCELLED", "late").await.unwrap();
        assert_eq!(store.job("b").await.unwrap().unwrap().status, "completed");
    }
}
