//! Export and import of the caller's own data (an ADMIN exports only their own rows too).
//!
//! `GET /api/export` → JSON, format `switchyard-inventory` version 1:
//! `{format, version, exportedAt, categories: [{id, name, color}], locations: [{id, name,
//! description}], items: [{id, name, description, manufacturer, barcode, buyPrice, buyDate,
//! quantity, minQuantity, categoryId, locationId, createdAt, updatedAt}]}` (images are not
//! exported). `GET /api/export?format=csv` → the items as CSV with the columns of
//! [`CSV_COLUMNS`] (category and location by name).
//!
//! `POST /api/import` takes either (JSON body, or `text/csv`). Everything is validated first
//! (every problem is reported, nothing is written); then one transaction applies it:
//! categories and locations are matched by name (created when missing), items by id among the
//! caller's items, else by barcode, else created (keeping the file's id when it is free). So a
//! bad file changes nothing and importing an export again changes nothing.

use std::collections::{HashMap, HashSet};

use axum::body::Body;
use axum::extract::{Extension, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sqlx::Row;

use futures::{StreamExt as _, TryStreamExt as _};

use crate::csv;
use crate::db::{is_unique_violation, new_id, now_iso, today_iso, User};
use crate::error::{ApiError, FieldError};
use crate::http::IMPORT_LIMIT;
use crate::http::{CurrentUser, Shared};
use crate::validate::{self, ItemInput};

/// Format name and version of the JSON export.
pub const FORMAT: &str = "switchyard-inventory";
pub const VERSION: i64 = 1;
/// Columns of the CSV export (import accepts them in any order; `name` is required).
pub const CSV_COLUMNS: &[&str] = &[
    "id",
    "name",
    "description",
    "manufacturer",
    "barcode",
    "buyPrice",
    "buyDate",
    "quantity",
    "minQuantity",
    "category",
    "location",
    "createdAt",
    "updatedAt",
];

/// A validated import document. References are by name.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// name → colour (`None`: keep an existing category's colour, default for a new one)
    pub categories: Vec<(String, Option<String>)>,
    /// name → description
    pub locations: Vec<(String, Option<String>)>,
    pub items: Vec<PlannedItem>,
}

#[derive(Debug, PartialEq)]
pub struct PlannedItem {
    /// Where it is in the file (`items[3]`, `line 5`), for messages.
    pub at: String,
    pub id: Option<String>,
    pub input: ItemInput,
    pub category: Option<String>,
    pub location: Option<String>,
}

fn problem(errs: &mut Vec<FieldError>, at: String, e: ApiError) {
    let field: &'static str = "import";
    match e {
        ApiError::Validation(list) => {
            for f in list {
                errs.push(FieldError::new(field, format!("{at}: {}", f.message)));
            }
        }
        other => errs.push(FieldError::new(field, format!("{at}: {other}"))),
    }
}

fn opt_uuid(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if uuid::Uuid::parse_str(s).is_ok() => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::BadRequest("id must be a UUID".into())),
    }
}

/// Validate a JSON export document into a [`Plan`].
pub fn plan_json(doc: &Value) -> Result<Plan, ApiError> {
    if doc.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(ApiError::field(
            "format",
            format!("format must be {FORMAT:?}"),
        ));
    }
    if doc.get("version").and_then(Value::as_i64) != Some(VERSION) {
        return Err(ApiError::field(
            "version",
            format!("unsupported version (this service reads {VERSION})"),
        ));
    }
    let list = |k: &str| -> Result<&[Value], ApiError> {
        match doc.get(k) {
            None | Some(Value::Null) => Ok(&[]),
            Some(Value::Array(a)) => Ok(a.as_slice()),
            Some(_) => Err(ApiError::BadRequest(format!("{k} must be an array"))),
        }
    };
    let mut errs = Vec::new();
    let mut plan = Plan::default();
    let mut cat_ids: HashMap<String, String> = HashMap::new();
    let mut loc_ids: HashMap<String, String> = HashMap::new();
    let mut names = HashSet::new();
    for (i, c) in list("categories")?.iter().enumerate() {
        match validate::category(c, true) {
            Ok(v) => {
                let name = v.name.unwrap_or_default();
                if !names.insert(name.clone()) {
                    problem(
                        &mut errs,
                        format!("categories[{i}]"),
                        ApiError::field("name", "Category already exists"),
                    );
                }
                if let Ok(Some(id)) = opt_uuid(c.get("id")) {
                    cat_ids.insert(id, name.clone());
                }
                plan.categories.push((name, v.color));
            }
            Err(e) => problem(&mut errs, format!("categories[{i}]"), e),
        }
    }
    names.clear();
    for (i, l) in list("locations")?.iter().enumerate() {
        match validate::location(l, true) {
            Ok(v) => {
                let name = v.name.unwrap_or_default();
                if !names.insert(name.clone()) {
                    problem(
                        &mut errs,
                        format!("locations[{i}]"),
                        ApiError::field("name", "Location already exists"),
                    );
                }
                if let Ok(Some(id)) = opt_uuid(l.get("id")) {
                    loc_ids.insert(id, name.clone());
                }
                plan.locations.push((name, v.description.flatten()));
            }
            Err(e) => problem(&mut errs, format!("locations[{i}]"), e),
        }
    }
    for (i, it) in list("items")?.iter().enumerate() {
        let at = format!("items[{i}]");
        let id = match opt_uuid(it.get("id")) {
            Ok(id) => id,
            Err(e) => {
                problem(&mut errs, at, e);
                continue;
            }
        };
        match validate::item(it, true) {
            Ok(mut input) => {
                let category = match input.category_id.take().flatten() {
                    Some(cid) => match cat_ids.get(&cid) {
                        Some(n) => Some(n.clone()),
                        None => {
                            problem(
                                &mut errs,
                                at.clone(),
                                ApiError::field("categoryId", "Category not found in the file"),
                            );
                            None
                        }
                    },
                    None => None,
                };
                let location = match input.location_id.take().flatten() {
                    Some(lid) => match loc_ids.get(&lid) {
                        Some(n) => Some(n.clone()),
                        None => {
                            problem(
                                &mut errs,
                                at.clone(),
                                ApiError::field("locationId", "Location not found in the file"),
                            );
                            None
                        }
                    },
                    None => None,
                };
                plan.items.push(PlannedItem {
                    at: at.clone(),
                    id,
                    input,
                    category,
                    location,
                });
            }
            Err(e) => problem(&mut errs, at, e),
        }
    }
    check_items(&plan, &mut errs);
    if errs.is_empty() {
        Ok(plan)
    } else {
        Err(ApiError::Validation(errs))
    }
}

/// Duplicate ids or barcodes inside one file.
fn check_items(plan: &Plan, errs: &mut Vec<FieldError>) {
    let mut ids = HashSet::new();
    let mut barcodes = HashSet::new();
    for it in &plan.items {
        let at = &it.at;
        if let Some(id) = &it.id {
            if !ids.insert(id.clone()) {
                errs.push(FieldError::new("import", format!("{at}: duplicate id")));
            }
        }
        if let Some(Some(b)) = &it.input.barcode {
            if !barcodes.insert(b.clone()) {
                errs.push(FieldError::new(
                    "import",
                    format!("{at}: Item with this barcode already exists"),
                ));
            }
        }
    }
}

/// Validate a CSV item document (header row first) into a [`Plan`].
pub fn plan_csv(text: &str) -> Result<Plan, ApiError> {
    plan_csv_records(parse_csv(text)?)
}

fn parse_csv(text: &str) -> Result<Vec<Vec<String>>, ApiError> {
    csv::parse(text).map_err(|e| ApiError::BadRequest(format!("Invalid CSV: {e}")))
}

/// Validate parsed CSV records (header row first) into a [`Plan`].
fn plan_csv_records(rows: Vec<Vec<String>>) -> Result<Plan, ApiError> {
    let Some((header, rows)) = rows.split_first() else {
        return Err(ApiError::BadRequest("Invalid CSV: no header row".into()));
    };
    let header: Vec<String> = header.iter().map(|h| h.trim().to_string()).collect();
    if !header.iter().any(|h| h == "name") {
        return Err(ApiError::BadRequest("Invalid CSV: no name column".into()));
    }
    if let Some(unknown) = header.iter().find(|h| !CSV_COLUMNS.contains(&h.as_str())) {
        return Err(ApiError::BadRequest(format!(
            "Invalid CSV: unknown column {unknown:?}"
        )));
    }
    let mut errs = Vec::new();
    let mut plan = Plan::default();
    let mut cats = HashSet::new();
    let mut locs = HashSet::new();
    for (i, row) in rows.iter().enumerate() {
        let at = format!("line {}", i + 2);
        if row.len() != header.len() {
            errs.push(FieldError::new(
                "import",
                format!(
                    "{at}: expected {} fields, found {}",
                    header.len(),
                    row.len()
                ),
            ));
            continue;
        }
        let mut obj = serde_json::Map::new();
        let mut id = None;
        let mut category = None;
        let mut location = None;
        for (h, v) in header.iter().zip(row) {
            let v = v.trim();
            match h.as_str() {
                "id" => id = Some(v.to_string()),
                "category" => category = Some(v.to_string()).filter(|s| !s.is_empty()),
                "location" => location = Some(v.to_string()).filter(|s| !s.is_empty()),
                "createdAt" | "updatedAt" => {}
                _ => {
                    obj.insert(
                        h.clone(),
                        if v.is_empty() {
                            Value::Null
                        } else {
                            Value::String(v.to_string())
                        },
                    );
                }
            }
        }
        let id = match opt_uuid(id.map(Value::String).as_ref()) {
            Ok(id) => id,
            Err(e) => {
                problem(&mut errs, at, e);
                continue;
            }
        };
        match validate::item(&Value::Object(obj), true) {
            Ok(input) => {
                if let Some(c) = &category {
                    if cats.insert(c.clone()) {
                        plan.categories.push((c.clone(), None));
                    }
                }
                if let Some(l) = &location {
                    if locs.insert(l.clone()) {
                        plan.locations.push((l.clone(), None));
                    }
                }
                plan.items.push(PlannedItem {
                    at: at.clone(),
                    id,
                    input,
                    category,
                    location,
                });
            }
            Err(e) => problem(&mut errs, at, e),
        }
    }
    check_items(&plan, &mut errs);
    if errs.is_empty() {
        Ok(plan)
    } else {
        Err(ApiError::Validation(errs))
    }
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// `GET /api/export[?format=csv]`.
pub async fn export(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let csv_wanted = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .any(|(k, v)| k == "format" && v == "csv");
    let cats =
        sqlx::query("SELECT id, name, color FROM categories WHERE user_id = $1 ORDER BY name, id")
            .bind(&user.id)
            .fetch_all(&st.pool)
            .await?;
    let locs = sqlx::query(
        "SELECT id, name, description FROM locations WHERE user_id = $1 ORDER BY name, id",
    )
    .bind(&user.id)
    .fetch_all(&st.pool)
    .await?;
    let items = sqlx::query(
        "SELECT i.id, i.name, i.description, i.manufacturer, i.barcode, i.buy_price, i.buy_date, i.quantity, \
         i.min_quantity, i.category_id, i.location_id, i.created_at, i.updated_at, c.name AS c_name, l.name AS l_name \
         FROM items i LEFT JOIN categories c ON c.id = i.category_id LEFT JOIN locations l ON l.id = i.location_id \
         WHERE i.user_id = $1 ORDER BY i.created_at, i.id",
    )
    .bind(&user.id)
    .fetch_all(&st.pool)
    .await?;
    let s = |r: &sqlx::any::AnyRow, k: &str| -> Result<Option<String>, sqlx::Error> {
        r.try_get::<Option<String>, _>(k)
    };
    if csv_wanted {
        let mut out = csv::line(
            &CSV_COLUMNS
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>(),
        );
        for r in &items {
            let fields = vec![
                s(r, "id")?.unwrap_or_default(),
                s(r, "name")?.unwrap_or_default(),
                s(r, "description")?.unwrap_or_default(),
                s(r, "manufacturer")?.unwrap_or_default(),
                s(r, "barcode")?.unwrap_or_default(),
                num(r.try_get::<f64, _>("buy_price")?),
                s(r, "buy_date")?
                    .unwrap_or_default()
                    .chars()
                    .take(10)
                    .collect(),
                r.try_get::<i64, _>("quantity")?.to_string(),
                r.try_get::<i64, _>("min_quantity")?.to_string(),
                s(r, "c_name")?.unwrap_or_default(),
                s(r, "l_name")?.unwrap_or_default(),
                s(r, "created_at")?.unwrap_or_default(),
                s(r, "updated_at")?.unwrap_or_default(),
            ];
            out.push_str(&csv::line(&fields));
        }
        let mut resp = out.into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/csv; charset=utf-8"),
        );
        resp.headers_mut().insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_static("attachment; filename=\"inventory-items.csv\""),
        );
        return Ok(resp);
    }
    let mut categories = Vec::new();
    for r in &cats {
        categories.push(json!({"id": s(r, "id")?, "name": s(r, "name")?, "color": s(r, "color")?}));
    }
    let mut locations = Vec::new();
    for r in &locs {
        locations.push(
            json!({"id": s(r, "id")?, "name": s(r, "name")?, "description": s(r, "description")?}),
        );
    }
    let mut list = Vec::new();
    for r in &items {
        list.push(json!({
            "id": s(r, "id")?, "name": s(r, "name")?, "description": s(r, "description")?,
            "manufacturer": s(r, "manufacturer")?, "barcode": s(r, "barcode")?,
            "buyPrice": r.try_get::<f64, _>("buy_price")?, "buyDate": s(r, "buy_date")?,
            "quantity": r.try_get::<i64, _>("quantity")?, "minQuantity": r.try_get::<i64, _>("min_quantity")?,
            "categoryId": s(r, "category_id")?, "locationId": s(r, "location_id")?,
            "createdAt": s(r, "created_at")?, "updatedAt": s(r, "updated_at")?,
        }));
    }
    let mut resp = Json(json!({
        "format": FORMAT, "version": VERSION, "exportedAt": now_iso(),
        "categories": categories, "locations": locations, "items": list,
    }))
    .into_response();
    resp.headers_mut().insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"inventory.json\""),
    );
    Ok(resp)
}

/// `POST /api/import` (JSON export document, or `text/csv` items), at most [`IMPORT_LIMIT`]
/// bytes. The body is never held twice: JSON is parsed while it streams in (only the parsed
/// document exists), CSV is read into one buffer that is dropped once split into records.
pub async fn import(
    State(st): State<Shared>,
    Extension(CurrentUser(user)): Extension<CurrentUser>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > IMPORT_LIMIT as u64) {
        return Err(too_large());
    }
    let plan = if ct.starts_with("text/csv") {
        let bytes = read_limited(body, declared).await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| ApiError::BadRequest("Invalid CSV: not UTF-8".into()))?;
        let records = parse_csv(&text)?;
        drop(text);
        plan_csv_records(records)?
    } else {
        if !(ct.starts_with("application/json") || ct.contains("+json")) {
            return Err(ApiError::BadRequest(
                "Content-Type must be application/json".into(),
            ));
        }
        plan_json(&json_from_stream(body).await?)?
    };
    let counts = apply(&st, &user, plan).await?;
    tracing::info!(user = %user.id, ?counts, "import applied");
    Ok(Json(json!({
        "success": true,
        "categories": {"created": counts[0], "updated": counts[1]},
        "locations": {"created": counts[2], "updated": counts[3]},
        "items": {"created": counts[4], "updated": counts[5]},
    }))
    .into_response())
}

fn too_large() -> ApiError {
    ApiError::TooLarge("Request body too large".into())
}

/// The whole body in one buffer (sized from `Content-Length` when given), at most
/// [`IMPORT_LIMIT`] bytes.
async fn read_limited(body: Body, declared: Option<u64>) -> Result<Vec<u8>, ApiError> {
    let capacity = declared.map_or(0, |n| n.min(IMPORT_LIMIT as u64) as usize);
    let mut buf = Vec::with_capacity(capacity);
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::BadRequest(format!("Cannot read the body: {e}")))?;
        if buf.len() + chunk.len() > IMPORT_LIMIT {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// Counts the bytes read through it, so an over-long body is told apart from bad JSON.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Parses a JSON body as it streams in (on a blocking thread), reading at most
/// [`IMPORT_LIMIT`] bytes.
async fn json_from_stream(body: Body) -> Result<Value, ApiError> {
    use tokio::io::AsyncReadExt as _;
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let limited = tokio_util::io::StreamReader::new(stream).take(IMPORT_LIMIT as u64 + 1);
    let reader = tokio_util::io::SyncIoBridge::new(limited);
    tokio::task::spawn_blocking(move || {
        let mut counted = Counted {
            inner: std::io::BufReader::with_capacity(64 * 1024, reader),
            read: 0,
        };
        let parsed = serde_json::from_reader::<_, Value>(&mut counted);
        if counted.read > IMPORT_LIMIT as u64 {
            return Err(too_large());
        }
        parsed.map_err(|e| {
            if e.is_io() {
                ApiError::BadRequest(format!("Cannot read the body: {e}"))
            } else {
                ApiError::BadRequest("Invalid JSON body".into())
            }
        })
    })
    .await
    .map_err(|e| ApiError::Internal(format!("import parser: {e}")))?
}

/// Apply a validated plan in one transaction; `[cat created, cat updated, loc created, loc
/// updated, items created, items updated]`.
async fn apply(st: &Shared, user: &User, plan: Plan) -> Result<[u64; 6], ApiError> {
    let mut n = [0u64; 6];
    let now = now_iso();
    // Reads (matching by name, id, barcode) come before the writes: take the write lock first.
    let mut tx = crate::db::begin_write(&st.pool, st.engine).await?;
    let mut cat_ids = HashMap::new();
    for (name, color) in &plan.categories {
        let row = sqlx::query("SELECT id, color FROM categories WHERE user_id = $1 AND name = $2")
            .bind(&user.id)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        let id = match row {
            Some(r) => {
                let id: String = r.try_get("id")?;
                let old: String = r.try_get("color")?;
                if color.as_ref().is_some_and(|c| *c != old) {
                    sqlx::query("UPDATE categories SET color = $1, updated_at = $2 WHERE id = $3")
                        .bind(color.clone())
                        .bind(&now)
                        .bind(&id)
                        .execute(&mut *tx)
                        .await?;
                    n[1] += 1;
                }
                id
            }
            None => {
                let id = new_id();
                sqlx::query("INSERT INTO categories (id, user_id, name, color, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)")
                    .bind(&id).bind(&user.id).bind(name)
                    .bind(color.clone().unwrap_or_else(|| validate::DEFAULT_COLOR.into())).bind(&now).execute(&mut *tx).await?;
                n[0] += 1;
                id
            }
        };
        cat_ids.insert(name.clone(), id);
    }
    let mut loc_ids = HashMap::new();
    for (name, desc) in &plan.locations {
        let row =
            sqlx::query("SELECT id, description FROM locations WHERE user_id = $1 AND name = $2")
                .bind(&user.id)
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        let id = match row {
            Some(r) => {
                let id: String = r.try_get("id")?;
                let old: Option<String> = r.try_get("description")?;
                if &old != desc && desc.is_some() {
                    sqlx::query(
                        "UPDATE locations SET description = $1, updated_at = $2 WHERE id = $3",
                    )
                    .bind(desc.clone())
                    .bind(&now)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?;
                    n[3] += 1;
                }
                id
            }
            None => {
                let id = new_id();
                sqlx::query("INSERT INTO locations (id, user_id, name, description, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)")
                    .bind(&id).bind(&user.id).bind(name).bind(desc.clone()).bind(&now).execute(&mut *tx).await?;
                n[2] += 1;
                id
            }
        };
        loc_ids.insert(name.clone(), id);
    }
    for it in plan.items {
        let i = it.input;
        let category = it.category.and_then(|c| cat_ids.get(&c).cloned());
        let location = it.location.and_then(|l| loc_ids.get(&l).cloned());
        let barcode = i.barcode.clone().flatten();
        // match: the caller's item with this id, else with this barcode
        let mut existing: Option<String> = None;
        let mut id_free = false;
        if let Some(id) = &it.id {
            let row = sqlx::query("SELECT user_id FROM items WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            match row {
                Some(r) if r.try_get::<String, _>("user_id")? == user.id => {
                    existing = Some(id.clone())
                }
                Some(_) => {}
                None => id_free = true,
            }
        }
        if existing.is_none() {
            if let Some(b) = &barcode {
                let row = sqlx::query("SELECT id FROM items WHERE user_id = $1 AND barcode = $2")
                    .bind(&user.id)
                    .bind(b)
                    .fetch_optional(&mut *tx)
                    .await?;
                existing = row.map(|r| r.try_get::<String, _>("id")).transpose()?;
            }
        }
        let values = (
            i.name.clone().unwrap_or_default(),
            i.description.clone().flatten(),
            i.manufacturer.clone().flatten(),
            barcode,
            i.buy_price.unwrap_or(0.0),
            i.buy_date.clone().unwrap_or_else(today_iso),
            i.quantity.unwrap_or(1),
            i.min_quantity.unwrap_or(0),
        );
        let search = crate::db::search_text(
            &values.0,
            values.1.as_deref(),
            values.2.as_deref(),
            values.3.as_deref(),
        );
        let res = match existing {
            Some(id) => {
                // unchanged rows are left alone (idempotent re-import keeps updatedAt)
                let same = sqlx::query(
                    "SELECT id FROM items WHERE id = $1 AND name = $2 AND COALESCE(description, '') = $3 \
                     AND COALESCE(manufacturer, '') = $4 AND COALESCE(barcode, '') = $5 AND buy_price = $6 \
                     AND buy_date = $7 AND quantity = $8 AND min_quantity = $9 \
                     AND COALESCE(category_id, '') = $10 AND COALESCE(location_id, '') = $11",
                )
                .bind(&id).bind(&values.0).bind(values.1.clone().unwrap_or_default())
                .bind(values.2.clone().unwrap_or_default()).bind(values.3.clone().unwrap_or_default())
                .bind(values.4).bind(&values.5).bind(values.6).bind(values.7)
                .bind(category.clone().unwrap_or_default()).bind(location.clone().unwrap_or_default())
                .fetch_optional(&mut *tx)
                .await?;
                if same.is_some() {
                    continue;
                }
                n[5] += 1;
                sqlx::query(
                    "UPDATE items SET name = $1, description = $2, manufacturer = $3, barcode = $4, buy_price = $5, \
                     buy_date = $6, quantity = $7, min_quantity = $8, category_id = $9, location_id = $10, updated_at = $11, \
                     search_text = $13 WHERE id = $12",
                )
                .bind(values.0).bind(values.1).bind(values.2).bind(values.3).bind(values.4).bind(values.5)
                .bind(values.6).bind(values.7).bind(category).bind(location).bind(&now).bind(&id).bind(search)
                .execute(&mut *tx)
                .await
            }
            None => {
                n[4] += 1;
                let id = match (&it.id, id_free) {
                    (Some(id), true) => id.clone(),
                    _ => new_id(),
                };
                sqlx::query(
                    "INSERT INTO items (id, user_id, name, description, manufacturer, barcode, buy_price, buy_date, \
                     quantity, min_quantity, category_id, location_id, created_at, updated_at, search_text) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14)",
                )
                .bind(id).bind(&user.id).bind(values.0).bind(values.1).bind(values.2).bind(values.3)
                .bind(values.4).bind(values.5).bind(values.6).bind(values.7).bind(category).bind(location).bind(&now)
                .bind(search)
                .execute(&mut *tx)
                .await
            }
        };
        match res {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => {
                return Err(ApiError::Conflict(
                    "Item with this barcode already exists".into(),
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    crate::db::add_item_count(&mut tx, &user.id, i64::try_from(n[4]).unwrap_or(0)).await?;
    tx.commit().await?;
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn messages(e: ApiError) -> Vec<String> {
        match e {
            ApiError::Validation(v) => v.into_iter().map(|f| f.message).collect(),
            other => vec![other.to_string()],
        }
    }

    #[test]
    fn json_plans_validate_everything_first() {
        let cid = "5b0c6b4e-1d7e-4e8a-9a51-3c1b2f0b9d11";
        let doc = json!({"format": FORMAT, "version": 1,
            "categories": [{"id": cid, "name": "Tools", "color": "#abc"}],
            "items": [{"name": "Saw", "categoryId": cid, "quantity": 2}]});
        let p = plan_json(&doc).unwrap();
        assert_eq!(
            p.categories,
            [("Tools".to_string(), Some("#aabbcc".to_string()))]
        );
        assert_eq!(p.items[0].category.as_deref(), Some("Tools"));
        let bad = json!({"format": FORMAT, "version": 1,
            "categories": [{"name": "A", "color": "nope"}, {"name": "B"}, {"name": "B"}],
            "items": [{"name": ""}, {"name": "x", "categoryId": "5b0c6b4e-1d7e-4e8a-9a51-3c1b2f0b9d12"},
                      {"name": "y", "barcode": "1"}, {"name": "z", "barcode": "1"}]});
        assert_eq!(
            messages(plan_json(&bad).unwrap_err()),
            [
                "categories[0]: Invalid color format",
                "categories[2]: Category already exists",
                "items[0]: Name is required",
                "items[1]: Category not found in the file",
                "items[3]: Item with this barcode already exists",
            ]
        );
        assert!(plan_json(&json!({"format": FORMAT, "version": 2})).is_err());
        assert!(plan_json(&json!({"version": 1})).is_err());
    }

    #[test]
    fn csv_plans() {
        let p = plan_csv("name,quantity,category\r\nSaw,3,Tools\r\nDrill,,Tools\r\n").unwrap();
        assert_eq!(p.categories.len(), 1);
        assert_eq!(p.items[0].input.quantity, Some(3));
        assert_eq!(p.items[1].input.quantity, None);
        assert_eq!(
            messages(plan_csv("name,quantity\nSaw,lots\n,1\n").unwrap_err()),
            [
                "line 2: quantity must be a non-negative integer",
                "line 3: Name is required",
            ]
        );
        assert!(plan_csv("nom\nx\n").is_err());
        assert!(plan_csv("name,bogus\nx,y\n").is_err());
        assert!(plan_csv("").is_err());
    }
}
