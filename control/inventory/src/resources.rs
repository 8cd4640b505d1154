//! Categories, locations and items. A `USER` reaches only rows whose `user_id` is theirs (any
//! other id is 404, exactly like an absent one); an `ADMIN` reaches every row.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::auth::body_or_error;
use crate::db::{self, is_unique_violation, new_id, now_iso, owner_of, User};
use crate::error::ApiError;
use crate::http::{parse_body, CurrentUser, Shared};
use crate::images;
use crate::validate::{self, Bind};

type Res = Result<Response, ApiError>;

fn json_body(headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    parse_body(headers, &body_or_error(body)?, false)
}

/// `AND user_id = $n` for a USER, nothing for an ADMIN.
fn scope(user: &User, n: usize, col: &str) -> String {
    if user.is_admin() {
        String::new()
    } else {
        format!(" AND {col} = ${n}")
    }
}

/// The owner of row `id` of `table` if the caller may reach it, else 404.
async fn owned(
    st: &Shared,
    user: &User,
    table: &str,
    id: &str,
    what: &'static str,
) -> Result<String, ApiError> {
    let sql = format!(
        "SELECT user_id FROM {table} WHERE id = $1{}",
        scope(user, 2, "user_id")
    );
    let mut q = sqlx::query(&sql).bind(id);
    if !user.is_admin() {
        q = q.bind(&user.id);
    }
    match q.fetch_optional(&st.pool).await? {
        Some(row) => Ok(row.try_get("user_id")?),
        None => Err(ApiError::NotFound(what)),
    }
}

fn success() -> Response {
    Json(json!({"success": true})).into_response()
}

// ---------------------------------------------------------------- categories

fn category_json(row: &AnyRow, with_count: bool) -> Result<Value, sqlx::Error> {
    let mut v = json!({
        "id": row.try_get::<String, _>("id")?,
        "name": row.try_get::<String, _>("name")?,
        "color": row.try_get::<String, _>("color")?,
        "userId": row.try_get::<String, _>("user_id")?,
        "createdAt": row.try_get::<String, _>("created_at")?,
        "updatedAt": row.try_get::<String, _>("updated_at")?,
    });
    if with_count {
        v["_count"] = json!({"items": row.try_get::<i64, _>("item_count")?});
    }
    Ok(v)
}

const CATEGORY_COLS: &str = "c.id, c.name, c.color, c.user_id, c.created_at, c.updated_at";

pub async fn list_categories(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
) -> Res {
    let filter = if user.is_admin() {
        ""
    } else {
        "WHERE c.user_id = $1"
    };
    let sql = format!(
        "SELECT {CATEGORY_COLS}, (SELECT COUNT(*) FROM items i WHERE i.category_id = c.id) AS item_count \
         FROM categories c {filter} ORDER BY c.name, c.id"
    );
    let mut q = sqlx::query(&sql);
    if !user.is_admin() {
        q = q.bind(&user.id);
    }
    let rows = q.fetch_all(&st.pool).await?;
    let list = rows
        .iter()
        .map(|r| category_json(r, true))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(json!({"categories": list})).into_response())
}

async fn category_by_id(st: &Shared, id: &str) -> Result<Value, ApiError> {
    let row = sqlx::query(&format!(
        "SELECT {CATEGORY_COLS} FROM categories c WHERE c.id = $1"
    ))
    .bind(id)
    .fetch_optional(&st.pool)
    .await?
    .ok_or(ApiError::NotFound("Category"))?;
    Ok(category_json(&row, false)?)
}

fn category_conflict(e: sqlx::Error) -> ApiError {
    if is_unique_violation(&e) {
        ApiError::field("name", "Category already exists")
    } else {
        e.into()
    }
}

pub async fn create_category(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Res {
    let input = validate::category(&json_body(&headers, body)?, true)?;
    let id = new_id();
    let now = now_iso();
    sqlx::query(
        "INSERT INTO categories (id, user_id, name, color, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)",
    )
    .bind(&id)
    .bind(&user.id)
    .bind(input.name.unwrap_or_default())
    .bind(input.color.unwrap_or_else(|| validate::DEFAULT_COLOR.into()))
    .bind(&now)
    .execute(&st.pool)
    .await
    .map_err(category_conflict)?;
    Ok((StatusCode::CREATED, Json(category_by_id(&st, &id).await?)).into_response())
}

pub async fn update_category(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Res {
    owned(&st, &user, "categories", &id, "Category").await?;
    let input = validate::category(&json_body(&headers, body)?, false)?;
    sqlx::query(
        "UPDATE categories SET name = COALESCE($1, name), color = COALESCE($2, color), updated_at = $3 WHERE id = $4",
    )
    .bind(input.name)
    .bind(input.color)
    .bind(now_iso())
    .bind(&id)
    .execute(&st.pool)
    .await
    .map_err(category_conflict)?;
    Ok(Json(category_by_id(&st, &id).await?).into_response())
}

pub async fn delete_category(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    Path(id): Path<String>,
) -> Res {
    owned(&st, &user, "categories", &id, "Category").await?;
    let mut tx = st.pool.begin().await?;
    sqlx::query("UPDATE items SET category_id = NULL, updated_at = $1 WHERE category_id = $2")
        .bind(now_iso())
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM categories WHERE id = $1")
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(success())
}

// ---------------------------------------------------------------- locations

fn location_json(row: &AnyRow, with_count: bool) -> Result<Value, sqlx::Error> {
    let mut v = json!({
        "id": row.try_get::<String, _>("id")?,
        "name": row.try_get::<String, _>("name")?,
        "description": row.try_get::<Option<String>, _>("description")?,
        "userId": row.try_get::<String, _>("user_id")?,
        "createdAt": row.try_get::<String, _>("created_at")?,
        "updatedAt": row.try_get::<String, _>("updated_at")?,
    });
    if with_count {
        v["_count"] = json!({"items": row.try_get::<i64, _>("item_count")?});
    }
    Ok(v)
}

const LOCATION_COLS: &str = "l.id, l.name, l.description, l.user_id, l.created_at, l.updated_at";

pub async fn list_locations(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
) -> Res {
    let filter = if user.is_admin() {
        ""
    } else {
        "WHERE l.user_id = $1"
    };
    let sql = format!(
        "SELECT {LOCATION_COLS}, (SELECT COUNT(*) FROM items i WHERE i.location_id = l.id) AS item_count \
         FROM locations l {filter} ORDER BY l.name, l.id"
    );
    let mut q = sqlx::query(&sql);
    if !user.is_admin() {
        q = q.bind(&user.id);
    }
    let rows = q.fetch_all(&st.pool).await?;
    let list = rows
        .iter()
        .map(|r| location_json(r, true))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(json!({"locations": list})).into_response())
}

async fn location_by_id(st: &Shared, id: &str) -> Result<Value, ApiError> {
    let row = sqlx::query(&format!(
        "SELECT {LOCATION_COLS} FROM locations l WHERE l.id = $1"
    ))
    .bind(id)
    .fetch_optional(&st.pool)
    .await?
    .ok_or(ApiError::NotFound("Location"))?;
    Ok(location_json(&row, false)?)
}

fn location_conflict(e: sqlx::Error) -> ApiError {
    if is_unique_violation(&e) {
        ApiError::field("name", "Location already exists")
    } else {
        e.into()
    }
}

pub async fn create_location(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Res {
    let input = validate::location(&json_body(&headers, body)?, true)?;
    let id = new_id();
    let now = now_iso();
    sqlx::query(
        "INSERT INTO locations (id, user_id, name, description, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)",
    )
    .bind(&id)
    .bind(&user.id)
    .bind(input.name.unwrap_or_default())
    .bind(input.description.flatten())
    .bind(&now)
    .execute(&st.pool)
    .await
    .map_err(location_conflict)?;
    Ok((StatusCode::CREATED, Json(location_by_id(&st, &id).await?)).into_response())
}

pub async fn update_location(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Res {
    owned(&st, &user, "locations", &id, "Location").await?;
    let input = validate::location(&json_body(&headers, body)?, false)?;
    let (set_desc, desc) = match input.description {
        Some(d) => (1i64, d),
        None => (0, None),
    };
    sqlx::query(
        "UPDATE locations SET name = COALESCE($1, name), \
         description = CASE WHEN $2 = 1 THEN $3 ELSE description END, updated_at = $4 WHERE id = $5",
    )
    .bind(input.name)
    .bind(set_desc)
    .bind(desc)
    .bind(now_iso())
    .bind(&id)
    .execute(&st.pool)
    .await
    .map_err(location_conflict)?;
    Ok(Json(location_by_id(&st, &id).await?).into_response())
}

pub async fn delete_location(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    Path(id): Path<String>,
) -> Res {
    owned(&st, &user, "locations", &id, "Location").await?;
    let mut tx = st.pool.begin().await?;
    sqlx::query("UPDATE items SET location_id = NULL, updated_at = $1 WHERE location_id = $2")
        .bind(now_iso())
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM locations WHERE id = $1")
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(success())
}

// ---------------------------------------------------------------- items

const ITEM_SELECT: &str =
    "SELECT i.id, i.user_id, i.name, i.description, i.manufacturer, i.barcode, \
    i.buy_price, i.buy_date, i.quantity, i.min_quantity, i.category_id, i.location_id, \
    i.created_at, i.updated_at, c.name AS c_name, c.color AS c_color, \
    l.name AS l_name, l.description AS l_description \
    FROM items i LEFT JOIN categories c ON c.id = i.category_id \
    LEFT JOIN locations l ON l.id = i.location_id";

fn item_json(row: &AnyRow) -> Result<Value, sqlx::Error> {
    let category_id: Option<String> = row.try_get("category_id")?;
    let location_id: Option<String> = row.try_get("location_id")?;
    let category = match &category_id {
        Some(id) => json!({"id": id, "name": row.try_get::<Option<String>, _>("c_name")?,
                           "color": row.try_get::<Option<String>, _>("c_color")?}),
        None => Value::Null,
    };
    let location = match &location_id {
        Some(id) => json!({"id": id, "name": row.try_get::<Option<String>, _>("l_name")?,
                           "description": row.try_get::<Option<String>, _>("l_description")?}),
        None => Value::Null,
    };
    Ok(json!({
        "id": row.try_get::<String, _>("id")?,
        "userId": row.try_get::<String, _>("user_id")?,
        "name": row.try_get::<String, _>("name")?,
        "description": row.try_get::<Option<String>, _>("description")?,
        "manufacturer": row.try_get::<Option<String>, _>("manufacturer")?,
        "barcode": row.try_get::<Option<String>, _>("barcode")?,
        "buyPrice": row.try_get::<f64, _>("buy_price")?,
        "buyDate": row.try_get::<String, _>("buy_date")?,
        "quantity": row.try_get::<i64, _>("quantity")?,
        "minQuantity": row.try_get::<i64, _>("min_quantity")?,
        "categoryId": category_id,
        "locationId": location_id,
        "category": category,
        "location": location,
        "images": [],
        "createdAt": row.try_get::<String, _>("created_at")?,
        "updatedAt": row.try_get::<String, _>("updated_at")?,
    }))
}

async fn item_by_id(st: &Shared, id: &str) -> Result<Value, ApiError> {
    let row = sqlx::query(&format!("{ITEM_SELECT} WHERE i.id = $1"))
        .bind(id)
        .fetch_optional(&st.pool)
        .await?
        .ok_or(ApiError::NotFound("Item"))?;
    let mut items = vec![item_json(&row)?];
    attach_images(st, &mut items).await?;
    Ok(items.pop().unwrap_or(Value::Null))
}

/// Fill `images` of each item JSON with one query.
async fn attach_images(st: &Shared, items: &mut [Value]) -> Result<(), ApiError> {
    if items.is_empty() {
        return Ok(());
    }
    let placeholders: Vec<String> = (1..=items.len()).map(|n| format!("${n}")).collect();
    let sql = format!(
        "SELECT {} FROM images WHERE item_id IN ({}) ORDER BY created_at, id",
        images::IMAGE_COLS,
        placeholders.join(", ")
    );
    let mut q = sqlx::query(&sql);
    for it in items.iter() {
        q = q.bind(it["id"].as_str().unwrap_or("").to_string());
    }
    let rows = q.fetch_all(&st.pool).await?;
    for row in &rows {
        let img = images::image_json(row)?;
        if let Some(it) = items.iter_mut().find(|it| it["id"] == img["itemId"]) {
            if let Some(list) = it["images"].as_array_mut() {
                list.push(img);
            }
        }
    }
    Ok(())
}

/// A category/location reference must name a row of the item's owner.
async fn check_ref(
    st: &Shared,
    table: &str,
    id: &Option<Option<String>>,
    owner: &str,
    field: &'static str,
    label: &str,
) -> Result<(), ApiError> {
    if let Some(Some(id)) = id {
        let found = sqlx::query(&format!(
            "SELECT id FROM {table} WHERE id = $1 AND user_id = $2"
        ))
        .bind(id)
        .bind(owner)
        .fetch_optional(&st.pool)
        .await?;
        if found.is_none() {
            return Err(ApiError::field(field, format!("{label} not found")));
        }
    }
    Ok(())
}

fn item_conflict(e: sqlx::Error) -> ApiError {
    if is_unique_violation(&e) {
        ApiError::Conflict("Item with this barcode already exists".into())
    } else {
        e.into()
    }
}

pub async fn list_items(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    RawQuery(raw): RawQuery,
) -> Res {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .into_owned()
        .collect();
    let q = validate::list_query(&pairs)?;
    let (filter, binds) = validate::list_where(&q, owner_of(&user));
    let count_sql = format!("SELECT COUNT(*) AS n FROM items i {filter}");
    let page_sql = format!("{ITEM_SELECT} {filter} {}", validate::list_tail(&q));
    let mut count = sqlx::query(&count_sql);
    let mut page = sqlx::query(&page_sql);
    for b in &binds {
        match b {
            Bind::Text(s) => {
                count = count.bind(s.clone());
                page = page.bind(s.clone());
            }
            Bind::Int(n) => {
                count = count.bind(*n);
                page = page.bind(*n);
            }
        }
    }
    let total: i64 = if q.unfiltered() {
        db::item_count(&st.pool, owner_of(&user)).await?
    } else {
        count.fetch_one(&st.pool).await?.try_get("n")?
    };
    let rows = page.fetch_all(&st.pool).await?;
    let mut items = rows.iter().map(item_json).collect::<Result<Vec<_>, _>>()?;
    attach_images(&st, &mut items).await?;
    let total_pages = (total + q.limit - 1) / q.limit;
    Ok(Json(json!({
        "items": items,
        "pagination": {"page": q.page, "limit": q.limit, "total": total, "totalPages": total_pages},
    }))
    .into_response())
}

pub async fn get_item(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    Path(id): Path<String>,
) -> Res {
    owned(&st, &user, "items", &id, "Item").await?;
    Ok(Json(item_by_id(&st, &id).await?).into_response())
}

pub async fn create_item(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Res {
    let input = validate::item(&json_body(&headers, body)?, true)?;
    check_ref(
        &st,
        "categories",
        &input.category_id,
        &user.id,
        "categoryId",
        "Category",
    )
    .await?;
    check_ref(
        &st,
        "locations",
        &input.location_id,
        &user.id,
        "locationId",
        "Location",
    )
    .await?;
    let id = new_id();
    let now = now_iso();
    let search = db::search_text(
        input.name.as_deref().unwrap_or_default(),
        input.description.clone().flatten().as_deref(),
        input.manufacturer.clone().flatten().as_deref(),
        input.barcode.clone().flatten().as_deref(),
    );
    let mut tx = st.pool.begin().await?;
    sqlx::query(
        "INSERT INTO items (id, user_id, name, description, manufacturer, barcode, buy_price, buy_date, \
         quantity, min_quantity, category_id, location_id, created_at, updated_at, search_text) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14)",
    )
    .bind(&id)
    .bind(&user.id)
    .bind(input.name.unwrap_or_default())
    .bind(input.description.flatten())
    .bind(input.manufacturer.flatten())
    .bind(input.barcode.flatten())
    .bind(input.buy_price.unwrap_or(0.0))
    .bind(input.buy_date.unwrap_or_else(db::today_iso))
    .bind(input.quantity.unwrap_or(1))
    .bind(input.min_quantity.unwrap_or(0))
    .bind(input.category_id.flatten())
    .bind(input.location_id.flatten())
    .bind(&now)
    .bind(search)
    .execute(&mut *tx)
    .await
    .map_err(item_conflict)?;
    db::add_item_count(&mut tx, &user.id, 1).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(item_by_id(&st, &id).await?)).into_response())
}

pub async fn update_item(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Res {
    let owner = owned(&st, &user, "items", &id, "Item").await?;
    let input = validate::item(&json_body(&headers, body)?, false)?;
    check_ref(
        &st,
        "categories",
        &input.category_id,
        &owner,
        "categoryId",
        "Category",
    )
    .await?;
    check_ref(
        &st,
        "locations",
        &input.location_id,
        &owner,
        "locationId",
        "Location",
    )
    .await?;
    // Nullable fields: a flag says "set" (1) so that null can clear them.
    let flag = |o: &Option<Option<String>>| i64::from(o.is_some());
    let mut tx = st.pool.begin().await?;
    sqlx::query(
        "UPDATE items SET name = COALESCE($1, name), \
         description = CASE WHEN $2 = 1 THEN $3 ELSE description END, \
         manufacturer = CASE WHEN $4 = 1 THEN $5 ELSE manufacturer END, \
         barcode = CASE WHEN $6 = 1 THEN $7 ELSE barcode END, \
         buy_price = COALESCE($8, buy_price), buy_date = COALESCE($9, buy_date), \
         quantity = COALESCE($10, quantity), min_quantity = COALESCE($11, min_quantity), \
         category_id = CASE WHEN $12 = 1 THEN $13 ELSE category_id END, \
         location_id = CASE WHEN $14 = 1 THEN $15 ELSE location_id END, \
         updated_at = $16 WHERE id = $17",
    )
    .bind(input.name.clone())
    .bind(flag(&input.description))
    .bind(input.description.clone().flatten())
    .bind(flag(&input.manufacturer))
    .bind(input.manufacturer.clone().flatten())
    .bind(flag(&input.barcode))
    .bind(input.barcode.clone().flatten())
    .bind(input.buy_price)
    .bind(input.buy_date.clone())
    .bind(input.quantity)
    .bind(input.min_quantity)
    .bind(flag(&input.category_id))
    .bind(input.category_id.clone().flatten())
    .bind(flag(&input.location_id))
    .bind(input.location_id.clone().flatten())
    .bind(now_iso())
    .bind(&id)
    .execute(&mut *tx)
    .await
    .map_err(item_conflict)?;
    db::refresh_search_text(&mut tx, &id).await?;
    tx.commit().await?;
    Ok(Json(item_by_id(&st, &id).await?).into_response())
}

pub async fn delete_item(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    Path(id): Path<String>,
) -> Res {
    let owner = owned(&st, &user, "items", &id, "Item").await?;
    let mut tx = st.pool.begin().await?;
    // The transaction writes first: on SQLite a deferred transaction that reads before it
    // writes cannot upgrade once a concurrent writer committed (SQLITE_BUSY, not retried by
    // the busy timeout), which two simultaneous deletes of one item ran into.
    let rows = sqlx::query("DELETE FROM images WHERE item_id = $1 RETURNING id")
        .bind(&id)
        .fetch_all(&mut *tx)
        .await?;
    let image_ids = rows
        .iter()
        .map(|r| r.try_get::<String, _>("id"))
        .collect::<Result<Vec<_>, _>>()?;
    // rows_affected, not 1: a concurrent delete of the same item must not count twice
    let deleted = sqlx::query("DELETE FROM items WHERE id = $1")
        .bind(&id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    db::add_item_count(&mut tx, &owner, -i64::try_from(deleted).unwrap_or(0)).await?;
    tx.commit().await?;
    // Files go after the commit: a failed delete leaves both rows and files intact.
    images::remove_files(&st, &image_ids).await;
    Ok(success())
}
