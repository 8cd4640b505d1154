//! Item images: upload (`multipart/form-data`, part `file`), list, serve, delete.
//!
//! The type is decided from the bytes, never from the client's header or file name: PNG, JPEG,
//! WebP and GIF are accepted, anything else is 400. Uploads above `limits.max_image_size` are
//! 413. Bytes live in the configured [`crate::image_store`] (`DATA_DIR/images/<id>` or
//! S3-compatible storage); metadata in the `images` table.
//! Access follows the item: whoever may reach the item may reach its images (else 404).

use axum::extract::{Extension, Multipart, Path as UrlPath, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::db::{new_id, now_iso, User};
use crate::error::ApiError;
use crate::http::{CurrentUser, Shared};

/// The image type of `bytes` by its signature.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// JSON of an image row.
pub fn image_json(row: &AnyRow) -> Result<Value, sqlx::Error> {
    let id: String = row.try_get("id")?;
    Ok(json!({
        "id": id,
        "itemId": row.try_get::<String, _>("item_id")?,
        "url": format!("/api/images/{id}"),
        "contentType": row.try_get::<String, _>("content_type")?,
        "size": row.try_get::<i64, _>("size")?,
        "filename": row.try_get::<Option<String>, _>("filename")?,
        "createdAt": row.try_get::<String, _>("created_at")?,
    }))
}

pub const IMAGE_COLS: &str = "id, item_id, content_type, size, filename, created_at";

/// 404 unless the caller may reach item `id`.
async fn reachable_item(st: &Shared, user: &User, id: &str) -> Result<(), ApiError> {
    let sql = if user.is_admin() {
        "SELECT id FROM items WHERE id = $1"
    } else {
        "SELECT id FROM items WHERE id = $1 AND user_id = $2"
    };
    let mut q = sqlx::query(sql).bind(id);
    if !user.is_admin() {
        q = q.bind(&user.id);
    }
    q.fetch_optional(&st.pool)
        .await?
        .map(|_| ())
        .ok_or(ApiError::NotFound("Item"))
}

/// `GET /api/items/{id}/images` → `{images: [...]}` (oldest first).
pub async fn list(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    UrlPath(item): UrlPath<String>,
) -> Result<Response, ApiError> {
    reachable_item(&st, &user, &item).await?;
    let rows = sqlx::query(&format!(
        "SELECT {IMAGE_COLS} FROM images WHERE item_id = $1 ORDER BY created_at, id"
    ))
    .bind(&item)
    .fetch_all(&st.pool)
    .await?;
    let list = rows.iter().map(image_json).collect::<Result<Vec<_>, _>>()?;
    Ok(Json(json!({"images": list})).into_response())
}

/// `POST /api/items/{id}/images` (multipart part `file`) → 201 with the image record.
pub async fn upload(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    UrlPath(item): UrlPath<String>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    reachable_item(&st, &user, &item).await?;
    let mut multipart = multipart.map_err(|e| {
        ApiError::BadRequest(format!(
            "Expected multipart/form-data with a part named file: {e}"
        ))
    })?;
    let limit = st.cfg.limits.max_image_size.0;
    let too_large = || ApiError::TooLarge(format!("Image too large (at most {limit} bytes)"));
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Err(ApiError::field(
                    "file",
                    "No file uploaded (part named file)",
                ))
            }
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
            Err(e) => {
                return Err(ApiError::BadRequest(format!(
                    "Malformed multipart body: {e}"
                )))
            }
        };
        if field.name() != Some("file") {
            continue;
        }
        let filename = field.file_name().map(|n| {
            n.chars()
                .filter(|c| !c.is_control())
                .take(255)
                .collect::<String>()
        });
        let mut field = field;
        let mut bytes: Vec<u8> = Vec::new();
        loop {
            match field.chunk().await {
                Ok(Some(chunk)) => {
                    if bytes.len() as u64 + chunk.len() as u64 > limit {
                        return Err(too_large());
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
                Err(e) => {
                    return Err(ApiError::BadRequest(format!(
                        "Malformed multipart body: {e}"
                    )))
                }
            }
        }
        let Some(content_type) = sniff(&bytes) else {
            return Err(ApiError::field(
                "file",
                "Unsupported image type (PNG, JPEG, WebP or GIF)",
            ));
        };
        let id = new_id();
        st.images
            .put(&id, &bytes)
            .await
            .map_err(|e| ApiError::Internal(format!("storing {e}")))?;
        let res = sqlx::query(
            "INSERT INTO images (id, item_id, content_type, size, filename, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(&item)
        .bind(content_type)
        .bind(bytes.len() as i64)
        .bind(filename)
        .bind(now_iso())
        .execute(&st.pool)
        .await;
        if let Err(e) = res {
            remove_files(&st, std::slice::from_ref(&id)).await;
            return Err(e.into());
        }
        let row = sqlx::query(&format!("SELECT {IMAGE_COLS} FROM images WHERE id = $1"))
            .bind(&id)
            .fetch_one(&st.pool)
            .await?;
        tracing::info!(item = %item, image = %id, content_type, size = bytes.len(), "image stored");
        return Ok((StatusCode::CREATED, Json(image_json(&row)?)).into_response());
    }
}

/// Remove stored image bytes (missing ones are fine; other failures are logged).
pub async fn remove_files(st: &Shared, ids: &[String]) {
    for id in ids {
        if let Err(e) = st.images.remove(id).await {
            tracing::warn!(image = %id, "cannot remove image bytes: {e}");
        }
    }
}

/// `GET /api/images/{imageId}`: the bytes with their sniffed type.
pub async fn serve(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    UrlPath(image): UrlPath<String>,
) -> Result<Response, ApiError> {
    let sql = if user.is_admin() {
        "SELECT g.content_type FROM images g JOIN items i ON i.id = g.item_id WHERE g.id = $1"
    } else {
        "SELECT g.content_type FROM images g JOIN items i ON i.id = g.item_id WHERE g.id = $1 AND i.user_id = $2"
    };
    let mut q = sqlx::query(sql).bind(&image);
    if !user.is_admin() {
        q = q.bind(&user.id);
    }
    let row = q
        .fetch_optional(&st.pool)
        .await?
        .ok_or(ApiError::NotFound("Image"))?;
    let content_type: String = row.try_get("content_type")?;
    let bytes = st
        .images
        .get(&image)
        .await
        .map_err(|e| ApiError::Internal(format!("reading {e}")))?
        .ok_or(ApiError::NotFound("Image"))?;
    let mut resp = bytes.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::try_from(content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=3600"),
    );
    Ok(resp)
}

#[derive(serde::Deserialize)]
pub struct DeleteQuery {
    #[serde(rename = "imageId")]
    image_id: Option<String>,
}

/// `DELETE /api/items/{id}/images?imageId=…` → `{success: true}`.
pub async fn delete(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    UrlPath(item): UrlPath<String>,
    Query(q): Query<DeleteQuery>,
) -> Result<Response, ApiError> {
    reachable_item(&st, &user, &item).await?;
    let Some(image) = q.image_id.filter(|s| !s.is_empty()) else {
        return Err(ApiError::field("imageId", "imageId is required"));
    };
    let n = sqlx::query("DELETE FROM images WHERE id = $1 AND item_id = $2")
        .bind(&image)
        .bind(&item)
        .execute(&st.pool)
        .await?
        .rows_affected();
    if n == 0 {
        return Err(ApiError::NotFound("Image"));
    }
    remove_files(&st, &[image]).await;
    Ok(Json(json!({"success": true})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_by_signature() {
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n...."), Some("image/png"));
        assert_eq!(sniff(&[0xff, 0xd8, 0xff, 0xe0]), Some("image/jpeg"));
        assert_eq!(sniff(b"GIF89a..."), Some("image/gif"));
        assert_eq!(sniff(b"RIFF\x10\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"RIFF\x10\0\0\0WAVEfmt "), None);
        assert_eq!(sniff(b"<svg xmlns=...>"), None);
        assert_eq!(sniff(b""), None);
    }
}
