//! Storage: one query set for SQLite and PostgreSQL through sqlx's `Any` driver.
//!
//! Decision: the schema and every query are written in the SQL both engines accept (TEXT ids,
//! ISO-8601 UTC timestamps as TEXT that sort lexically, BIGINT, DOUBLE PRECISION, `$n`
//! placeholders — SQLite understands them too —, `LOWER(…) LIKE … ESCAPE`, `ON CONFLICT … DO
//! NOTHING`), so one migration directory serves both and no query is duplicated. The `Any`
//! driver only decodes plain types (text, integers, floats), which is all the schema uses.
//! SQLite runs in WAL mode with foreign keys on and a busy timeout; migrations run at start.

use chrono::{SecondsFormat, Utc};
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};

use crate::error::ApiError;

pub use switchyard_sqlstore::{begin_write, is_unique_violation, now_iso, redact, DbError, Engine};

/// Embedded migrations (control/inventory/migrations).
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Connect, set SQLite pragmas, run migrations, prepare the search index.
pub async fn open(url: &str) -> Result<(AnyPool, Engine), DbError> {
    let (pool, engine) = switchyard_sqlstore::open(url, &MIGRATOR).await?;
    search_index(&pool, engine).await?;
    backfill_search_text(&pool).await?;
    Ok((pool, engine))
}

/// The index behind `search` (see migration 0004), per engine because the useful kinds differ:
/// SQLite scans a covering `(user_id, search_text)` index instead of whole rows; PostgreSQL
/// answers `LIKE '%…%'` from a trigram GIN index (`pg_trgm`, a trusted extension since 13;
/// a B-tree would also refuse long descriptions). Without `pg_trgm` search still works, by a
/// sequential scan, and the log says so.
async fn search_index(pool: &AnyPool, engine: Engine) -> Result<(), DbError> {
    match engine {
        Engine::Sqlite => {
            sqlx::query(
                "CREATE INDEX IF NOT EXISTS items_user_search ON items (user_id, search_text)",
            )
            .execute(pool)
            .await?;
        }
        Engine::Postgres => {
            let made = async {
                sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_trgm")
                    .execute(pool)
                    .await?;
                sqlx::query(
                    "CREATE INDEX IF NOT EXISTS items_search_trgm ON items \
                     USING gin (search_text gin_trgm_ops)",
                )
                .execute(pool)
                .await
            }
            .await;
            if let Err(e) = made {
                tracing::warn!("no trigram index for item search (pg_trgm unavailable?): {e}");
            }
        }
    }
    Ok(())
}

/// The `search_text` of an item: its searchable fields, lower-cased, one per line.
pub fn search_text(
    name: &str,
    description: Option<&str>,
    manufacturer: Option<&str>,
    barcode: Option<&str>,
) -> String {
    [Some(name), description, manufacturer, barcode]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase()
}

/// Recompute `search_text` of item `id` from its stored fields (after a partial update).
pub async fn refresh_search_text(
    conn: &mut sqlx::AnyConnection,
    id: &str,
) -> Result<(), sqlx::Error> {
    let row =
        sqlx::query("SELECT name, description, manufacturer, barcode FROM items WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some(r) = row {
        let text = search_text(
            &r.try_get::<String, _>("name")?,
            r.try_get::<Option<String>, _>("description")?.as_deref(),
            r.try_get::<Option<String>, _>("manufacturer")?.as_deref(),
            r.try_get::<Option<String>, _>("barcode")?.as_deref(),
        );
        sqlx::query("UPDATE items SET search_text = $1 WHERE id = $2")
            .bind(text)
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Fill `search_text` of rows written before migration 0004 (once; later starts find none).
async fn backfill_search_text(pool: &AnyPool) -> Result<(), DbError> {
    let ids: Vec<String> = sqlx::query("SELECT id FROM items WHERE search_text IS NULL")
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| r.try_get("id"))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    for id in &ids {
        refresh_search_text(&mut tx, id).await?;
    }
    tx.commit().await?;
    tracing::info!(
        items = ids.len(),
        "filled the search text of existing items"
    );
    Ok(())
}

/// Today at UTC midnight, the default `buyDate`.
pub fn today_iso() -> String {
    format!("{}T00:00:00.000Z", Utc::now().format("%Y-%m-%d"))
}

/// A new record id: UUID v7, ordered by creation within the process, so that lists sorted by
/// `createdAt` (millisecond resolution) with the id as tie-break keep creation order even for
/// records made in the same millisecond.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A new session id: UUID v4, all 122 bits random (a v7 id would reveal its creation time and
/// carry fewer random bits).
pub fn new_session_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A user row.
#[derive(Debug, Clone)]
pub struct User {
    pub id: String,
    pub name: Option<String>,
    pub email: String,
    pub role: String,
    pub password_hash: String,
}

impl User {
    pub fn is_admin(&self) -> bool {
        self.role == "ADMIN"
    }

    pub fn public_json(&self) -> serde_json::Value {
        serde_json::json!({"id": self.id, "name": self.name, "email": self.email, "role": self.role})
    }
}

fn user_from(row: &AnyRow) -> Result<User, sqlx::Error> {
    Ok(User {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        email: row.try_get("email")?,
        role: row.try_get("role")?,
        password_hash: row.try_get("password_hash")?,
    })
}

const USER_COLS: &str = "id, name, email, role, password_hash";

pub async fn user_by_email(pool: &AnyPool, email: &str) -> Result<Option<User>, ApiError> {
    let row = sqlx::query(&format!("SELECT {USER_COLS} FROM users WHERE email = $1"))
        .bind(email)
        .fetch_optional(pool)
        .await?;
    Ok(row.as_ref().map(user_from).transpose()?)
}

pub async fn user_by_id(pool: &AnyPool, id: &str) -> Result<Option<User>, ApiError> {
    let row = sqlx::query(&format!("SELECT {USER_COLS} FROM users WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?;
    Ok(row.as_ref().map(user_from).transpose()?)
}

/// The user of live session `sid` (which must belong to `user_id`), if the session row exists.
pub async fn user_by_session(
    pool: &AnyPool,
    sid: &str,
    user_id: &str,
) -> Result<Option<User>, ApiError> {
    let row = sqlx::query(
        "SELECT u.id, u.name, u.email, u.role, u.password_hash FROM sessions s \
         JOIN users u ON u.id = s.user_id WHERE s.id = $1 AND s.user_id = $2",
    )
    .bind(sid)
    .bind(user_id)
    .fetch_optional(pool)
    .await?;
    Ok(row.as_ref().map(user_from).transpose()?)
}

/// Record a new session of `user_id` ending at `expires` (Unix seconds) at the latest; purge
/// the rows of sessions past their absolute expiry on the way.
pub async fn create_session(
    pool: &AnyPool,
    sid: &str,
    user_id: &str,
    expires: i64,
) -> Result<(), ApiError> {
    let now = now_iso();
    sqlx::query("DELETE FROM sessions WHERE expires_at < $1")
        .bind(&now)
        .execute(pool)
        .await?;
    let expires = chrono::DateTime::from_timestamp(expires, 0)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| "9999-12-31T23:59:59.999Z".into());
    sqlx::query(
        "INSERT INTO sessions (id, user_id, created_at, expires_at) VALUES ($1, $2, $3, $4)",
    )
    .bind(sid)
    .bind(user_id)
    .bind(&now)
    .bind(expires)
    .execute(pool)
    .await?;
    Ok(())
}

/// Revoke session `sid` (sign-out).
pub async fn delete_session(pool: &AnyPool, sid: &str) -> Result<(), ApiError> {
    sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(sid)
        .execute(pool)
        .await?;
    Ok(())
}

/// Insert a user; the first one becomes ADMIN. The decision and the insert are one
/// transaction: claiming the `first_admin` settings row (primary key) is what makes a user
/// ADMIN, so of two simultaneous first registrations exactly one claims it (the other blocks on
/// the row/database lock and then finds it taken). A failed insert rolls the claim back.
pub async fn create_user(
    pool: &AnyPool,
    name: Option<&str>,
    email: &str,
    password_hash: &str,
) -> Result<User, ApiError> {
    let id = new_id();
    let now = now_iso();
    let mut tx = pool.begin().await?;
    let claimed = sqlx::query(
        "INSERT INTO settings (key, value) VALUES ('first_admin', $1) ON CONFLICT (key) DO NOTHING",
    )
    .bind(&id)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    let role = if claimed { "ADMIN" } else { "USER" };
    let res = sqlx::query(
        "INSERT INTO users (id, name, email, password_hash, role, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $6)",
    )
    .bind(&id)
    .bind(name)
    .bind(email)
    .bind(password_hash)
    .bind(role)
    .bind(&now)
    .execute(&mut *tx)
    .await;
    match res {
        Ok(_) => {}
        Err(e) if is_unique_violation(&e) => {
            return Err(ApiError::Conflict(
                "User with this email already exists".into(),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    tx.commit().await?;
    Ok(User {
        id,
        name: name.map(str::to_string),
        email: email.to_string(),
        role: role.to_string(),
        password_hash: password_hash.to_string(),
    })
}

/// Move the stored item count of `user_id` by `delta` (migration 0005). Call it in the
/// transaction that inserts or deletes that user's items, so the count commits or rolls back
/// with them; the upsert takes the counter row's lock, so concurrent writers add up exactly.
pub async fn add_item_count(
    conn: &mut sqlx::AnyConnection,
    user_id: &str,
    delta: i64,
) -> Result<(), sqlx::Error> {
    if delta == 0 {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO item_counts (user_id, n) VALUES ($1, $2) \
         ON CONFLICT (user_id) DO UPDATE SET n = item_counts.n + excluded.n",
    )
    .bind(user_id)
    .bind(delta)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Exact number of items of `owner` (`None` = everyone's) from the stored counts.
pub async fn item_count(pool: &AnyPool, owner: Option<&str>) -> Result<i64, sqlx::Error> {
    match owner {
        Some(u) => sqlx::query("SELECT n FROM item_counts WHERE user_id = $1")
            .bind(u)
            .fetch_optional(pool)
            .await?
            .map_or(Ok(0), |r| r.try_get("n")),
        // SUM of BIGINT is NUMERIC on PostgreSQL, which the Any driver cannot decode.
        None => sqlx::query("SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n FROM item_counts")
            .fetch_one(pool)
            .await?
            .try_get("n"),
    }
}

/// Owner filter: `None` = admin, sees all.
pub fn owner_of(user: &User) -> Option<&str> {
    (!user.is_admin()).then_some(user.id.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_text_is_lower_case_unicode_one_field_per_line() {
        assert_eq!(
            search_text("Ölfilter XL", None, Some("MAHLE"), Some("B-12")),
            "ölfilter xl\nmahle\nb-12"
        );
        assert_eq!(search_text("A", Some("Größe"), None, None), "a\ngröße");
    }

    #[test]
    fn record_ids_sort_in_creation_order_within_one_millisecond() {
        let ids: Vec<String> = (0..2000).map(|_| new_id()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids out of order");
        let sid = new_session_id();
        assert_eq!(
            uuid::Uuid::parse_str(&sid).map(|u| u.get_version_num()),
            Ok(4)
        );
    }
}
