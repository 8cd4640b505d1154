//! Input validation and query building, runtime-free. Messages here are what users see.

use chrono::{NaiveDate, Utc};
use serde_json::{Map, Value};

use crate::error::{ApiError, FieldError};

/// Default category colour.
pub const DEFAULT_COLOR: &str = "#6366f1";
/// Largest `limit` of the item list.
pub const MAX_LIMIT: i64 = 100;
/// Longest user name.
pub const MAX_NAME: usize = 100;
/// Shortest password.
pub const MIN_PASSWORD: usize = 8;
/// Longest free-text field (names, descriptions, barcodes) accepted.
pub const MAX_TEXT: usize = 10_000;

/// `#abc` / `#aabbcc` (any case) → lowercase `#aabbcc`; anything else → `None`.
pub fn parse_color(s: &str) -> Option<String> {
    let hex = s.strip_prefix('#')?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match hex.len() {
        6 => Some(format!("#{}", hex.to_ascii_lowercase())),
        3 => Some(format!(
            "#{}",
            hex.chars()
                .flat_map(|c| [c, c])
                .collect::<String>()
                .to_ascii_lowercase()
        )),
        _ => None,
    }
}

/// A pragmatic e-mail check: one `@`, non-empty local part, a dotted domain, no spaces.
pub fn valid_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && local.len() <= 64
        && s.len() <= 254
        && !domain.contains('@')
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains("..")
}

/// Normalized e-mail (trimmed, lowercase): the account key.
pub fn normalize_email(s: &str) -> String {
    s.trim().to_lowercase()
}

/// Registration input, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub name: Option<String>,
    pub email: String,
    pub password: String,
}

fn opt_str(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, ()> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(()),
    }
}

/// `{name?, email, password, confirmPassword}` → [`Registration`] or every problem.
pub fn registration(body: &Value) -> Result<Registration, ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(ApiError::BadRequest("Expected a JSON object".into()));
    };
    let mut errs = Vec::new();
    let name = match opt_str(obj, "name") {
        Ok(n) => n.map(|n| n.trim().to_string()).filter(|n| !n.is_empty()),
        Err(()) => {
            errs.push(FieldError::new("name", "Name must be a string"));
            None
        }
    };
    if name.as_ref().is_some_and(|n| n.chars().count() > MAX_NAME) {
        errs.push(FieldError::new(
            "name",
            "Name must be at most 100 characters",
        ));
    }
    let email = opt_str(obj, "email").ok().flatten().unwrap_or_default();
    let email = normalize_email(&email);
    if email.is_empty() {
        errs.push(FieldError::new("email", "Email is required"));
    } else if !valid_email(&email) {
        errs.push(FieldError::new("email", "Invalid email address"));
    }
    let password = opt_str(obj, "password").ok().flatten().unwrap_or_default();
    let confirm = opt_str(obj, "confirmPassword")
        .ok()
        .flatten()
        .unwrap_or_default();
    if password.chars().count() < MIN_PASSWORD {
        errs.push(FieldError::new(
            "password",
            "Password must be at least 8 characters",
        ));
    } else if password.len() > 72 {
        // bcrypt only looks at 72 bytes; refuse rather than silently truncate.
        errs.push(FieldError::new(
            "password",
            "Password must be at most 72 bytes",
        ));
    }
    if password != confirm {
        errs.push(FieldError::new("confirmPassword", "Passwords do not match"));
    }
    if !errs.is_empty() {
        return Err(ApiError::Validation(errs));
    }
    Ok(Registration {
        name,
        email,
        password,
    })
}

fn body_object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    body.as_object()
        .ok_or_else(|| ApiError::BadRequest("Expected a JSON object".into()))
}

fn required_name(obj: &Map<String, Value>) -> Result<String, ApiError> {
    match obj.get("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => {
            let s = s.trim().to_string();
            if s.chars().count() > MAX_TEXT {
                return Err(ApiError::field("name", "Name is too long"));
            }
            Ok(s)
        }
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err(ApiError::field("name", "Name is required"))
        }
        Some(_) => Err(ApiError::field("name", "Name must be a string")),
    }
}

/// Nullable text: absent → `None`, `null` or blank → `Some(None)`, text → `Some(Some(t))`.
fn nullable_text(
    obj: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<Option<String>>, ApiError> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(Value::String(s)) => {
            let t = s.trim();
            if t.chars().count() > MAX_TEXT {
                return Err(ApiError::field(key, format!("{key} is too long")));
            }
            Ok(Some((!t.is_empty()).then(|| t.to_string())))
        }
        Some(_) => Err(ApiError::field(key, format!("{key} must be a string"))),
    }
}

/// Category create (`full`) or update input: name and colour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CategoryInput {
    pub name: Option<String>,
    pub color: Option<String>,
}

/// POST (`create` = true: name required, colour defaults) or PUT (both optional).
pub fn category(body: &Value, create: bool) -> Result<CategoryInput, ApiError> {
    let obj = body_object(body)?;
    let name = if create || obj.contains_key("name") {
        Some(required_name(obj)?)
    } else {
        None
    };
    let color = match obj.get("color") {
        None | Some(Value::Null) => create.then(|| DEFAULT_COLOR.to_string()),
        Some(Value::String(s)) => Some(
            parse_color(s.trim())
                .ok_or_else(|| ApiError::field("color", "Invalid color format"))?,
        ),
        Some(_) => return Err(ApiError::field("color", "Invalid color format")),
    };
    Ok(CategoryInput { name, color })
}

/// Location create or update input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationInput {
    pub name: Option<String>,
    /// `None` = unchanged; `Some(None)` = cleared.
    pub description: Option<Option<String>>,
}

/// POST (`create`: name required) or PUT (subset).
pub fn location(body: &Value, create: bool) -> Result<LocationInput, ApiError> {
    let obj = body_object(body)?;
    let name = if create || obj.contains_key("name") {
        Some(required_name(obj)?)
    } else {
        None
    };
    let description = nullable_text(obj, "description")?;
    Ok(LocationInput { name, description })
}

/// Item fields; every one optional so that one type serves create (defaults filled by
/// [`ItemInput::with_defaults`]) and update (only present fields change).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ItemInput {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub manufacturer: Option<Option<String>>,
    pub barcode: Option<Option<String>>,
    pub buy_price: Option<f64>,
    /// Stored form: `YYYY-MM-DDT00:00:00.000Z`.
    pub buy_date: Option<String>,
    pub quantity: Option<i64>,
    pub min_quantity: Option<i64>,
    pub category_id: Option<Option<String>>,
    pub location_id: Option<Option<String>>,
}

/// `YYYY-MM-DD` or an ISO date-time → the stored full date-time at UTC midnight of that date
/// (date-times keep their date in UTC).
pub fn parse_buy_date(s: &str) -> Option<String> {
    let s = s.trim();
    let date = if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        d
    } else {
        chrono::DateTime::parse_from_rfc3339(s)
            .ok()?
            .with_timezone(&Utc)
            .date_naive()
    };
    Some(format!("{}T00:00:00.000Z", date.format("%Y-%m-%d")))
}

fn number(
    obj: &Map<String, Value>,
    key: &'static str,
    label: &str,
) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if f.is_finite() && f >= 0.0 => Ok(Some(f)),
            _ => Err(ApiError::field(
                key,
                format!("{label} must be a non-negative number"),
            )),
        },
        // form-style clients send numbers as strings
        Some(Value::String(s)) if !s.trim().is_empty() => match s.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && f >= 0.0 => Ok(Some(f)),
            _ => Err(ApiError::field(
                key,
                format!("{label} must be a non-negative number"),
            )),
        },
        Some(_) => Err(ApiError::field(
            key,
            format!("{label} must be a non-negative number"),
        )),
    }
}

fn integer(
    obj: &Map<String, Value>,
    key: &'static str,
    label: &str,
) -> Result<Option<i64>, ApiError> {
    let bad = || ApiError::field(key, format!("{label} must be a non-negative integer"));
    let f = number(obj, key, label).map_err(|_| bad())?;
    match f {
        None => Ok(None),
        Some(f) if f.fract() == 0.0 && f <= 1e15 => Ok(Some(f as i64)),
        Some(_) => Err(bad()),
    }
}

fn id_ref(obj: &Map<String, Value>, key: &'static str) -> Result<Option<Option<String>>, ApiError> {
    match nullable_text(obj, key)? {
        Some(Some(id)) if uuid::Uuid::parse_str(&id).is_err() => {
            Err(ApiError::field(key, format!("{key} must be a UUID")))
        }
        other => Ok(other),
    }
}

/// Parse item fields (create: `name` required).
pub fn item(body: &Value, create: bool) -> Result<ItemInput, ApiError> {
    let obj = body_object(body)?;
    let name = if create || obj.contains_key("name") {
        Some(required_name(obj)?)
    } else {
        None
    };
    let buy_date = match obj.get("buyDate") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(parse_buy_date(s).ok_or_else(|| {
            ApiError::field("buyDate", "buyDate must be an ISO date (YYYY-MM-DD)")
        })?),
        Some(_) => {
            return Err(ApiError::field(
                "buyDate",
                "buyDate must be an ISO date (YYYY-MM-DD)",
            ))
        }
    };
    Ok(ItemInput {
        name,
        description: nullable_text(obj, "description")?,
        manufacturer: nullable_text(obj, "manufacturer")?,
        barcode: nullable_text(obj, "barcode")?,
        buy_price: number(obj, "buyPrice", "buyPrice")?,
        buy_date,
        quantity: integer(obj, "quantity", "quantity")?,
        min_quantity: integer(obj, "minQuantity", "minQuantity")?,
        category_id: id_ref(obj, "categoryId")?,
        location_id: id_ref(obj, "locationId")?,
    })
}

/// Whitelisted `sortBy` values and their columns.
pub const SORT_FIELDS: &[(&str, &str)] = &[
    ("createdAt", "i.created_at"),
    ("updatedAt", "i.updated_at"),
    ("name", "i.name"),
    ("quantity", "i.quantity"),
    ("minQuantity", "i.min_quantity"),
    ("buyPrice", "i.buy_price"),
    ("buyDate", "i.buy_date"),
    ("manufacturer", "i.manufacturer"),
];

/// The parsed query of `GET /api/items`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub search: Option<String>,
    pub category_id: Option<String>,
    pub location_id: Option<String>,
    pub low_stock: bool,
    pub page: i64,
    pub limit: i64,
    pub sort_column: &'static str,
    pub descending: bool,
}

impl ListQuery {
    /// No filter narrows the owner's items, so the stored count is the total.
    pub fn unfiltered(&self) -> bool {
        self.search.is_none()
            && self.category_id.is_none()
            && self.location_id.is_none()
            && !self.low_stock
    }
}

/// Parse the query pairs of `GET /api/items` (unknown keys are ignored).
pub fn list_query(pairs: &[(String, String)]) -> Result<ListQuery, ApiError> {
    let get = |k: &str| {
        pairs
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.trim())
    };
    let int = |k: &'static str, default: i64, max: i64| -> Result<i64, ApiError> {
        match get(k) {
            None | Some("") => Ok(default),
            Some(v) => match v.parse::<i64>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(ApiError::field(
                    k,
                    format!("{k} must be an integer from 1 to {max}"),
                )),
            },
        }
    };
    let sort_by = get("sortBy")
        .filter(|s| !s.is_empty())
        .unwrap_or("createdAt");
    let Some(sort_column) = SORT_FIELDS
        .iter()
        .find(|(k, _)| *k == sort_by)
        .map(|(_, c)| *c)
    else {
        let allowed: Vec<&str> = SORT_FIELDS.iter().map(|(k, _)| *k).collect();
        return Err(ApiError::field(
            "sortBy",
            format!("sortBy must be one of {}", allowed.join(", ")),
        ));
    };
    let descending = match get("sortOrder").unwrap_or("desc") {
        "" | "desc" => true,
        "asc" => false,
        _ => {
            return Err(ApiError::field(
                "sortOrder",
                "sortOrder must be asc or desc",
            ))
        }
    };
    let low_stock = match get("lowStock").unwrap_or("false") {
        "" | "false" | "0" => false,
        "true" | "1" => true,
        _ => {
            return Err(ApiError::field(
                "lowStock",
                "lowStock must be true or false",
            ))
        }
    };
    let nonempty = |k: &str| get(k).filter(|v| !v.is_empty()).map(str::to_string);
    Ok(ListQuery {
        search: nonempty("search"),
        category_id: nonempty("categoryId"),
        location_id: nonempty("locationId"),
        low_stock,
        page: int("page", 1, 1_000_000_000)?,
        limit: int("limit", 20, MAX_LIMIT)?,
        sort_column,
        descending,
    })
}

/// A bound value of a built query.
#[derive(Debug, Clone, PartialEq)]
pub enum Bind {
    Text(String),
    Int(i64),
}

/// `WHERE` clause (portable SQL, `$n` placeholders) and its binds for a list query.
/// `owner` = `None` for an admin (everyone's items).
pub fn list_where(q: &ListQuery, owner: Option<&str>) -> (String, Vec<Bind>) {
    let mut clauses = Vec::new();
    let mut binds = Vec::new();
    let next = |b: Bind, binds: &mut Vec<Bind>| {
        binds.push(b);
        format!("${}", binds.len())
    };
    if let Some(u) = owner {
        let p = next(Bind::Text(u.to_string()), &mut binds);
        clauses.push(format!("i.user_id = {p}"));
    }
    if let Some(s) = &q.search {
        let pattern = format!("%{}%", escape_like(&s.to_lowercase()));
        let p = next(Bind::Text(pattern), &mut binds);
        // one lower-cased column of name, description, manufacturer and barcode (db::search_text)
        clauses.push(format!("i.search_text LIKE {p} ESCAPE '\\'"));
    }
    if let Some(c) = &q.category_id {
        let p = next(Bind::Text(c.clone()), &mut binds);
        clauses.push(format!("i.category_id = {p}"));
    }
    if let Some(l) = &q.location_id {
        let p = next(Bind::Text(l.clone()), &mut binds);
        clauses.push(format!("i.location_id = {p}"));
    }
    if q.low_stock {
        clauses.push("i.quantity <= i.min_quantity".into());
    }
    let sql = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    (sql, binds)
}

/// `ORDER BY … LIMIT … OFFSET …` for a list query (column from the whitelist only).
pub fn list_tail(q: &ListQuery) -> String {
    let dir = if q.descending { "DESC" } else { "ASC" };
    let offset = (q.page - 1).saturating_mul(q.limit);
    format!(
        "ORDER BY {} {dir}, i.id {dir} LIMIT {} OFFSET {offset}",
        q.sort_column, q.limit
    )
}

/// Escape `%`, `_` and `\` for `LIKE … ESCAPE '\'`.
pub fn escape_like(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn colors() {
        assert_eq!(parse_color("#ABC").as_deref(), Some("#aabbcc"));
        assert_eq!(parse_color("#6366F1").as_deref(), Some("#6366f1"));
        for bad in [
            "6366f1",
            "#12",
            "#1234",
            "#ggg",
            "#12345g",
            "",
            "#",
            "#aabbccdd",
        ] {
            assert_eq!(parse_color(bad), None, "{bad}");
        }
    }

    #[test]
    fn emails() {
        assert!(valid_email("a@b.co"));
        for bad in [
            "", "a", "a@", "@b.co", "a@b", "a b@c.de", "a@b..c", "a@@b.c", "a@.b.c",
        ] {
            assert!(!valid_email(bad), "{bad}");
        }
        assert_eq!(normalize_email("  A@B.Co "), "a@b.co");
    }

    fn messages(e: ApiError) -> Vec<String> {
        match e {
            ApiError::Validation(v) => v.into_iter().map(|f| f.message).collect(),
            other => vec![other.to_string()],
        }
    }

    #[test]
    fn registration_messages() {
        let ok = registration(
            &json!({"email":"X@y.org","password":"12345678","confirmPassword":"12345678"}),
        )
        .unwrap();
        assert_eq!(ok.email, "x@y.org");
        assert_eq!(ok.name, None);
        let e = registration(&json!({"name":"n".repeat(101),"email":"bad","password":"short","confirmPassword":"other"})).unwrap_err();
        assert_eq!(
            messages(e),
            [
                "Name must be at most 100 characters",
                "Invalid email address",
                "Password must be at least 8 characters",
                "Passwords do not match"
            ]
        );
        assert!(registration(&json!([])).is_err());
        assert!(registration(&json!({"name": "n".repeat(100), "email":"a@b.cd","password":"12345678","confirmPassword":"12345678"})).is_ok());
    }

    #[test]
    fn categories_and_locations() {
        let c = category(&json!({"name":" Tools "}), true).unwrap();
        assert_eq!(c.name.as_deref(), Some("Tools"));
        assert_eq!(c.color.as_deref(), Some(DEFAULT_COLOR));
        let c = category(&json!({"color":"#FFF"}), false).unwrap();
        assert_eq!((c.name, c.color.as_deref()), (None, Some("#ffffff")));
        assert_eq!(
            messages(category(&json!({"name":"x","color":"red"}), true).unwrap_err()),
            ["Invalid color format"]
        );
        assert_eq!(
            messages(category(&json!({"name":""}), true).unwrap_err()),
            ["Name is required"]
        );
        let l = location(&json!({"name":"Shelf","description":""}), true).unwrap();
        assert_eq!(l.description, Some(None));
        assert_eq!(location(&json!({}), false).unwrap().description, None);
    }

    #[test]
    fn items() {
        let i = item(
            &json!({"name":"Drill","buyDate":"2024-03-05","quantity":3,"buyPrice":"9.5"}),
            true,
        )
        .unwrap();
        assert_eq!(i.buy_date.as_deref(), Some("2024-03-05T00:00:00.000Z"));
        assert_eq!((i.quantity, i.buy_price), (Some(3), Some(9.5)));
        let i = item(&json!({"buyDate":"2024-03-05T23:30:00-02:00"}), false).unwrap();
        assert_eq!(i.buy_date.as_deref(), Some("2024-03-06T00:00:00.000Z"));
        assert_eq!(
            messages(item(&json!({"name":"x","quantity":1.5}), true).unwrap_err()),
            ["quantity must be a non-negative integer"]
        );
        assert_eq!(
            messages(item(&json!({"name":"x","buyPrice":-1}), true).unwrap_err()),
            ["buyPrice must be a non-negative number"]
        );
        assert_eq!(
            messages(item(&json!({"name":"x","buyDate":"yesterday"}), true).unwrap_err()),
            ["buyDate must be an ISO date (YYYY-MM-DD)"]
        );
        assert_eq!(
            messages(item(&json!({"name":"x","categoryId":"nope"}), true).unwrap_err()),
            ["categoryId must be a UUID"]
        );
        assert_eq!(
            messages(item(&json!({}), true).unwrap_err()),
            ["Name is required"]
        );
        assert_eq!(
            item(&json!({"categoryId":null}), false)
                .unwrap()
                .category_id,
            Some(None)
        );
    }

    fn pairs(q: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(q.as_bytes()).into_owned().collect()
    }

    #[test]
    fn list_queries() {
        let q = list_query(&pairs("")).unwrap();
        assert_eq!(
            (q.page, q.limit, q.sort_column, q.descending, q.low_stock),
            (1, 20, "i.created_at", true, false)
        );
        assert!(q.unfiltered());
        for f in ["search=x", "categoryId=c", "locationId=l", "lowStock=true"] {
            assert!(!list_query(&pairs(f)).unwrap().unfiltered(), "{f}");
        }
        assert!(
            list_query(&pairs("search=&page=2&sortBy=name&lowStock=false"))
                .unwrap()
                .unfiltered()
        );
        assert_eq!(
            list_tail(&q),
            "ORDER BY i.created_at DESC, i.id DESC LIMIT 20 OFFSET 0"
        );
        let q = list_query(&pairs(
            "search=50%25_off&categoryId=c&lowStock=true&page=3&limit=10&sortBy=name&sortOrder=asc",
        ))
        .unwrap();
        let (w, b) = list_where(&q, Some("u"));
        assert!(w.starts_with("WHERE i.user_id = $1 AND i.search_text LIKE $2 ESCAPE '\\'"));
        assert!(w.ends_with("AND i.category_id = $3 AND i.quantity <= i.min_quantity"));
        assert_eq!(
            b,
            [
                Bind::Text("u".into()),
                Bind::Text("%50\\%\\_off%".into()),
                Bind::Text("c".into())
            ]
        );
        assert_eq!(
            list_tail(&q),
            "ORDER BY i.name ASC, i.id ASC LIMIT 10 OFFSET 20"
        );
        let (w, b) = list_where(&list_query(&pairs("")).unwrap(), None);
        assert!(w.is_empty() && b.is_empty());
        for bad in [
            "sortBy=password_hash",
            "sortBy=i.name;--",
            "sortOrder=up",
            "limit=0",
            "limit=101",
            "page=0",
            "page=x",
            "lowStock=maybe",
        ] {
            assert!(list_query(&pairs(bad)).is_err(), "{bad}");
        }
    }
}
