//! Whether a request may be answered from the cache, whether a response may be stored, and
//! for how long it stays fresh. Pure functions of the heads and the rule: no clock (the
//! origin's `Date` header is the reference time), no I/O.
//!
//! # Two modes, chosen per rule by `respect_cache_control`
//!
//! **Off (default, lancache style).** The rule decides: every `200` response to a `GET` the
//! rule covers is stored for the rule's `ttl`. Request and response `Cache-Control`,
//! `Pragma`, `Expires`, `Vary`, `Set-Cookie` and `Authorization` are ignored. This is what a
//! LAN download cache wants for game, console and OS CDNs, whose content is addressed by
//! version or hash but often served with `no-cache`/`private` or short `max-age`. The price:
//! `Vary` is not honoured (a compressed variant could be served to a client that did not ask
//! for it), so use it only for hosts serving downloads. `Set-Cookie` is never stored in
//! either mode (see [`stored_headers`]), so one client's cookie is never replayed to another.
//!
//! **On (RFC 9111 for a shared cache, simplified).**
//!
//! * Request `Cache-Control: no-store` → not looked up, not stored ([`Bypass::RequestNoStore`]).
//!   Request `no-cache`, `max-age=0` or `Pragma: no-cache` → [`wants_fresh_copy`]: fetch from
//!   the origin (the result may be stored).
//! * Response `no-store` → [`Bypass::NoStore`]; `private` (also the field-qualified form) →
//!   [`Bypass::Private`]; `no-cache` (also qualified) → [`Bypass::NoCache`], because this cache
//!   does not revalidate; `Set-Cookie` → [`Bypass::SetCookie`]; `Vary: *` →
//!   [`Bypass::VaryStar`]; other `Vary` names → [`Freshness::vary`] (store the response under
//!   [`variant_key`]).
//! * A request with `Authorization` gets its response stored only when the response says
//!   `public`, `s-maxage` or `must-revalidate` (RFC 9111 §3.5), else [`Bypass::Authorization`].
//! * Lifetime: `s-maxage`, else `max-age`, else `Expires − Date`, else the heuristic 10 % of
//!   `Date − Last-Modified` (RFC 9111 §4.2.2), else the configured `default_ttl`; minus the
//!   response's `Age`; **capped by the rule's `ttl`** so an operator bounds how stale any
//!   entry can be. A lifetime of zero (`max-age=0`, an `Expires` in the past or unparsable,
//!   a `Date` equal to `Last-Modified`) → [`Bypass::Expired`]. `Expires` is only used with a
//!   `Date` header (there is no clock here). An invalid or repeated-and-conflicting `max-age`
//!   counts as `0` (stale), huge ones are clamped to 2^31 seconds (RFC 9111 §1.2.2).
//!
//! # Always
//!
//! * Only `GET` responses are stored; a rule's `methods` decides which requests may be
//!   *answered* from the cache (`HEAD` from the entry of the `GET` with the same key).
//! * Only status `200` is stored. `206` is never stored (a range request for an uncached file
//!   makes the store fetch the whole file); redirects, `404`/`410` and other heuristically
//!   cacheable statuses are not stored either: on download CDNs they are usually transient
//!   (a mirror in sync, an expired token) and storing them for the rule's TTL would break
//!   clients.
//! * Requests carrying a body or an `Upgrade` are never cached.
//! * `content_types`: the response's media type (without parameters, case-insensitive) must
//!   equal a filter `type/subtype` or start with a filter ending in `/` (`application/`);
//!   no `Content-Type` fails a non-empty filter.
//! * Size: a `Content-Length` above the rule's `max_size` (0 = none) or `max_file_size` →
//!   [`Bypass::TooLarge`]. Without `Content-Length` the store enforces [`size_limit`] while
//!   it writes.

use std::time::Duration;

use super::rules::CacheRule;
use crate::http1::{Header, RequestHead, ResponseHead};

/// Why a request or response bypasses the cache. [`Bypass::label`] is the `reason` label of
/// `proxy_cache_misses_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bypass {
    /// No enabled rule matches the host.
    NoRule,
    /// The method is not in the rule's `methods` (request), or is not `GET` (response).
    Method,
    /// The request carries a body or asks for a protocol upgrade.
    RequestBody,
    /// Request `Cache-Control: no-store`.
    RequestNoStore,
    /// Response to a request with `Authorization` that is not explicitly shareable.
    Authorization,
    /// Response status other than 200.
    Status,
    /// Response `Cache-Control: no-store`.
    NoStore,
    /// Response `Cache-Control: private`.
    Private,
    /// Response `Cache-Control: no-cache` (needs revalidation, which this cache doesn't do).
    NoCache,
    /// Response sets a cookie.
    SetCookie,
    /// Response `Vary: *`.
    VaryStar,
    /// Response is already stale (freshness lifetime zero).
    Expired,
    /// Response media type not in the rule's `content_types`.
    ContentType,
    /// Response larger than the rule's `max_size` or `cache.max_file_size`.
    TooLarge,
}

impl Bypass {
    /// Every reason, for registering metric label values up front.
    pub const ALL: [Bypass; 14] = [
        Bypass::NoRule,
        Bypass::Method,
        Bypass::RequestBody,
        Bypass::RequestNoStore,
        Bypass::Authorization,
        Bypass::Status,
        Bypass::NoStore,
        Bypass::Private,
        Bypass::NoCache,
        Bypass::SetCookie,
        Bypass::VaryStar,
        Bypass::Expired,
        Bypass::ContentType,
        Bypass::TooLarge,
    ];

    /// The snake_case metric label.
    pub const fn label(&self) -> &'static str {
        match self {
            Bypass::NoRule => "no_rule",
            Bypass::Method => "method",
            Bypass::RequestBody => "request_body",
            Bypass::RequestNoStore => "request_no_store",
            Bypass::Authorization => "authorization",
            Bypass::Status => "status",
            Bypass::NoStore => "no_store",
            Bypass::Private => "private",
            Bypass::NoCache => "no_cache",
            Bypass::SetCookie => "set_cookie",
            Bypass::VaryStar => "vary_star",
            Bypass::Expired => "expired",
            Bypass::ContentType => "content_type",
            Bypass::TooLarge => "too_large",
        }
    }
}

impl std::fmt::Display for Bypass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// How long a storable response stays fresh, and which request headers select its variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freshness {
    /// Freshness lifetime from now (the response's `Age` already subtracted); never zero.
    pub ttl: Duration,
    /// Lower-cased, sorted, de-duplicated header names of the response's `Vary` (empty when
    /// the rule ignores cache control or the response has no `Vary`).
    pub vary: Vec<String>,
}

/// Whether `head` may be answered from (or fill) the cache under `rule`. See the
/// [module docs](self).
pub fn check_request(head: &RequestHead, rule: &CacheRule) -> Result<(), Bypass> {
    if !rule.caches_method(&head.method) {
        return Err(Bypass::Method);
    }
    let has_body = head.header("transfer-encoding").is_some()
        || head
            .header("content-length")
            .is_some_and(|v| parse_u64(v) != Some(0));
    if has_body || head.header("upgrade").is_some() {
        return Err(Bypass::RequestBody);
    }
    if rule.respect_cache_control && CacheControl::of(&head.headers).no_store {
        return Err(Bypass::RequestNoStore);
    }
    Ok(())
}

/// With `respect_cache_control`, whether the client asks for a response from the origin
/// rather than a stored one (request `no-cache`, `max-age=0` or `Pragma: no-cache`). The
/// fetched response may be stored, replacing the old entry. Always false without
/// `respect_cache_control`.
pub fn wants_fresh_copy(head: &RequestHead, rule: &CacheRule) -> bool {
    if !rule.respect_cache_control {
        return false;
    }
    let cc = CacheControl::of(&head.headers);
    if cc.directives == 0 {
        // RFC 9111 §5.4: Pragma only counts when there is no Cache-Control.
        return all_values(&head.headers, "pragma")
            .flat_map(split_list)
            .any(|d| d.eq_ignore_ascii_case(b"no-cache"));
    }
    cc.no_cache || cc.max_age == Some(0)
}

/// Whether the response to `request` may be stored under `rule`, and for how long. See the
/// [module docs](self). `default_ttl` is `cache.default_ttl`, `max_file_size` is
/// `cache.max_file_size` in bytes.
pub fn check_response(
    request: &RequestHead,
    response: &ResponseHead,
    rule: &CacheRule,
    default_ttl: Duration,
    max_file_size: u64,
) -> Result<Freshness, Bypass> {
    if request.method != "GET" {
        return Err(Bypass::Method);
    }
    if response.status != 200 {
        return Err(Bypass::Status);
    }
    if !content_type_allowed(response.header("content-type"), &rule.content_types) {
        return Err(Bypass::ContentType);
    }
    if let Some(len) = response.header("content-length").and_then(parse_u64) {
        if len > size_limit(rule, max_file_size) {
            return Err(Bypass::TooLarge);
        }
    }
    if !rule.respect_cache_control {
        if rule.ttl.is_zero() {
            return Err(Bypass::Expired);
        }
        return Ok(Freshness {
            ttl: rule.ttl,
            vary: Vec::new(),
        });
    }

    let cc = CacheControl::of(&response.headers);
    if cc.no_store {
        return Err(Bypass::NoStore);
    }
    if cc.private {
        return Err(Bypass::Private);
    }
    if cc.no_cache {
        return Err(Bypass::NoCache);
    }
    if response.header("set-cookie").is_some() {
        return Err(Bypass::SetCookie);
    }
    if request.header("authorization").is_some()
        && !(cc.public || cc.s_maxage.is_some() || cc.must_revalidate)
    {
        return Err(Bypass::Authorization);
    }
    let vary = vary_names(response)?;

    let lifetime = freshness_lifetime(response, &cc, default_ttl);
    let age = response
        .header("age")
        .and_then(parse_u64)
        .map_or(Duration::ZERO, Duration::from_secs);
    let ttl = lifetime.saturating_sub(age).min(rule.ttl);
    if ttl.is_zero() {
        return Err(Bypass::Expired);
    }
    Ok(Freshness { ttl, vary })
}

/// The largest body storable under `rule`: the smaller of the rule's `max_size` (0 = no
/// limit) and `max_file_size`. A store writing a body of unknown length stops (and discards
/// the entry) once it grows past this.
pub fn size_limit(rule: &CacheRule, max_file_size: u64) -> u64 {
    if rule.max_size == 0 {
        max_file_size
    } else {
        rule.max_size.min(max_file_size)
    }
}

/// Lower-cased, sorted, de-duplicated `Vary` names; `Err(VaryStar)` for `*`.
fn vary_names(response: &ResponseHead) -> Result<Vec<String>, Bypass> {
    let mut names = Vec::new();
    for name in all_values(&response.headers, "vary").flat_map(split_list) {
        if name == b"*" {
            return Err(Bypass::VaryStar);
        }
        if let Ok(s) = std::str::from_utf8(name) {
            names.push(s.to_ascii_lowercase());
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

fn freshness_lifetime(
    response: &ResponseHead,
    cc: &CacheControl,
    default_ttl: Duration,
) -> Duration {
    if let Some(s) = cc.s_maxage.or(cc.max_age) {
        return Duration::from_secs(s);
    }
    let date = response.header("date").and_then(parse_http_date);
    if let Some(expires) = response.header("expires") {
        // Without a Date there is no reference time here: fall through to the heuristic.
        if let Some(date) = date {
            return match parse_http_date(expires) {
                Some(e) => Duration::from_secs(e.saturating_sub(date)),
                // RFC 9111 §5.3: an invalid Expires (e.g. "0") means already expired.
                None => Duration::ZERO,
            };
        }
    }
    if let (Some(date), Some(modified)) = (
        date,
        response.header("last-modified").and_then(parse_http_date),
    ) {
        return Duration::from_secs(date.saturating_sub(modified) / 10);
    }
    default_ttl
}

/// Whether a `Content-Type` passes the rule's `content_types` filters.
fn content_type_allowed(content_type: Option<&[u8]>, filters: &[String]) -> bool {
    if filters.is_empty() {
        return true;
    }
    let Some(ct) = content_type else {
        return false;
    };
    let media = ct.split(|&b| b == b';').next().unwrap_or_default();
    let media = trim(media);
    filters.iter().any(|f| {
        let f = f.trim().as_bytes();
        if f.ends_with(b"/") {
            media
                .get(..f.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(f))
        } else {
            media.eq_ignore_ascii_case(f)
        }
    })
}

/// The key of the variant of `base_key` that `request` selects, for a response stored with
/// [`Freshness::vary`] = `vary`. With no `vary` names this is `base_key` itself. Otherwise
/// `base_key#vary(name=value;name2;…)`: names in the given (sorted) order, each with the
/// request's value — several header lines joined by `,`, whitespace around each element
/// removed — and without `=` when the request lacks the header. Bytes outside visible ASCII
/// and `%;=()#` in values are percent-encoded. Base keys never contain `#` (fragments are
/// dropped), so variant keys cannot collide with base keys.
pub fn variant_key(base_key: &str, vary: &[String], request: &RequestHead) -> String {
    if vary.is_empty() {
        return base_key.to_owned();
    }
    let mut key = String::with_capacity(base_key.len() + 16 * vary.len());
    key.push_str(base_key);
    key.push_str("#vary(");
    for (i, name) in vary.iter().enumerate() {
        if i > 0 {
            key.push(';');
        }
        key.push_str(name);
        let mut values = all_values(&request.headers, name).peekable();
        if values.peek().is_none() {
            continue;
        }
        key.push('=');
        let mut first = true;
        for element in values.flat_map(split_list) {
            if !first {
                key.push(',');
            }
            first = false;
            for &b in element {
                if b.is_ascii_graphic() && !b"%;=()#,".contains(&b) {
                    key.push(char::from(b));
                } else {
                    key.push_str(&format!("%{b:02X}"));
                }
            }
        }
    }
    key.push(')');
    key
}

/// The response headers to keep in a cache entry: everything but hop-by-hop fields (and
/// those named in `Connection`), `Set-Cookie`/`Set-Cookie2` (never replayed to another
/// client), `Age` (recomputed when served) and the body framing (`Content-Length`,
/// `Transfer-Encoding`, `Content-Range`: the store frames the stored body itself).
pub fn stored_headers(response: &ResponseHead) -> Vec<(String, Vec<u8>)> {
    let connection_named: Vec<&[u8]> = all_values(&response.headers, "connection")
        .flat_map(split_list)
        .collect();
    const DROP: [&str; 14] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "set-cookie",
        "set-cookie2",
        "age",
        "content-length",
        "content-range",
    ];
    response
        .headers
        .iter()
        .filter(|h| {
            !DROP.iter().any(|d| h.name.eq_ignore_ascii_case(d))
                && !connection_named
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(h.name.as_bytes()))
        })
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Cache-Control

/// The `Cache-Control` directives this cache acts on (RFC 9111 §5.2), from every
/// `Cache-Control` line of a message. Names are case-insensitive; values may be tokens or
/// quoted strings (commas inside quotes don't split); unknown directives are ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheControl {
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache`, with or without field names.
    pub no_cache: bool,
    /// `private`, with or without field names.
    pub private: bool,
    /// `public`.
    pub public: bool,
    /// `must-revalidate`.
    pub must_revalidate: bool,
    /// `max-age` in seconds: invalid or conflicting repeats → `Some(0)`; capped at 2^31.
    pub max_age: Option<u64>,
    /// `s-maxage`, same rules as `max_age`.
    pub s_maxage: Option<u64>,
    /// Number of directives seen (any name), to tell "no Cache-Control" from "nothing known".
    pub directives: usize,
}

/// RFC 9111 §1.2.2: delta-seconds beyond 2^31 are treated as 2^31.
const MAX_DELTA_SECONDS: u64 = 1 << 31;

impl CacheControl {
    /// Parses every `Cache-Control` header in `headers`.
    pub fn of(headers: &[Header]) -> CacheControl {
        Self::parse(all_values(headers, "cache-control"))
    }

    /// Parses header values (each a comma-separated directive list).
    pub fn parse<'a>(values: impl Iterator<Item = &'a [u8]>) -> CacheControl {
        let mut cc = CacheControl::default();
        for value in values {
            for directive in split_list(value) {
                cc.directives += 1;
                let (name, arg) = match directive.iter().position(|&b| b == b'=') {
                    Some(i) => (
                        trim(directive.get(..i).unwrap_or_default()),
                        Some(unquote(trim(directive.get(i + 1..).unwrap_or_default()))),
                    ),
                    None => (directive, None),
                };
                let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
                if is("no-store") {
                    cc.no_store = true;
                } else if is("no-cache") {
                    cc.no_cache = true;
                } else if is("private") {
                    cc.private = true;
                } else if is("public") {
                    cc.public = true;
                } else if is("must-revalidate") {
                    cc.must_revalidate = true;
                } else if is("max-age") {
                    merge_delta(&mut cc.max_age, arg.as_deref());
                } else if is("s-maxage") {
                    merge_delta(&mut cc.s_maxage, arg.as_deref());
                }
            }
        }
        cc
    }
}

/// A (possibly repeated) delta-seconds directive: invalid → 0; repeats that disagree → 0 (the
/// most restrictive reading, RFC 9111 §4.2.1).
fn merge_delta(slot: &mut Option<u64>, arg: Option<&[u8]>) {
    let v = arg.and_then(parse_delta).unwrap_or(0);
    *slot = match *slot {
        None => Some(v),
        Some(old) if old == v => Some(v),
        Some(_) => Some(0),
    };
}

/// Delta-seconds: one or more digits; larger than 2^31 → 2^31.
fn parse_delta(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: u64 = 0;
    for &d in v {
        n = n.saturating_mul(10).saturating_add(u64::from(d - b'0'));
    }
    Some(n.min(MAX_DELTA_SECONDS))
}

/// Removes surrounding quotes and backslash escapes from a quoted-string.
fn unquote(v: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match v.strip_prefix(b"\"").and_then(|x| x.strip_suffix(b"\"")) {
        Some(inner) if inner.contains(&b'\\') => {
            let mut out = Vec::with_capacity(inner.len());
            let mut escaped = false;
            for &b in inner {
                if escaped || b != b'\\' {
                    out.push(b);
                    escaped = false;
                } else {
                    escaped = true;
                }
            }
            std::borrow::Cow::Owned(out)
        }
        Some(inner) => std::borrow::Cow::Borrowed(inner),
        None => std::borrow::Cow::Borrowed(v),
    }
}

// ---------------------------------------------------------------------------------------------
// Header helpers

fn all_values<'a>(headers: &'a [Header], name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_slice())
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => v.get(s..=e).unwrap_or_default(),
        _ => &[],
    }
}

/// Splits a comma-separated list, ignoring commas inside quoted strings; trims elements and
/// skips empty ones.
fn split_list(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, &b) in v.iter().enumerate() {
        if in_quotes {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_quotes = false;
            }
        } else if b == b'"' {
            in_quotes = true;
        } else if b == b',' {
            parts.push(trim(v.get(start..i).unwrap_or_default()));
            start = i + 1;
        }
    }
    parts.push(trim(v.get(start..).unwrap_or_default()));
    parts.into_iter().filter(|p| !p.is_empty())
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(trim(v)).ok()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// HTTP dates (RFC 9110 §5.6.7)

const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];
const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];

/// Parses an HTTP date in any of the three RFC 9110 forms — IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`), RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime
/// (`Sun Nov  6 08:49:37 1994`) — into seconds since the Unix epoch. The weekday is not
/// checked; dates before 1970 or invalid ones give `None`. Two-digit RFC 850 years below 70
/// are taken as 20xx.
pub fn parse_http_date(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(trim(v)).ok()?;
    let (_weekday, rest) = s.split_once([',', ' '])?;
    let rest = rest.trim_start();
    let parts: Vec<&str> = rest.split_ascii_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        // IMF-fixdate: 06 Nov 1994 08:49:37 GMT
        [day, month, year, time, "GMT"] if s.contains(',') && !day.contains('-') => {
            (day.parse().ok()?, *month, year.parse().ok()?, *time)
        }
        // RFC 850: 06-Nov-94 08:49:37 GMT
        [dmy, time, "GMT"] if s.contains(',') => {
            let mut it = dmy.split('-');
            let (d, m, y) = (it.next()?, it.next()?, it.next()?);
            if it.next().is_some() || y.len() != 2 {
                return None;
            }
            let y: u64 = y.parse().ok()?;
            (
                d.parse().ok()?,
                m,
                if y < 70 { 2000 + y } else { 1900 + y },
                *time,
            )
        }
        // asctime: Nov  6 08:49:37 1994
        [month, day, time, year] if !s.contains(',') => {
            (day.parse().ok()?, *month, year.parse().ok()?, *time)
        }
        _ => return None,
    };
    let month = MONTHS
        .iter()
        .position(|m| m.as_slice() == month.as_bytes())? as u64
        + 1;
    let mut hms = time.split(':');
    let (h, m, sec) = (hms.next()?, hms.next()?, hms.next()?);
    if hms.next().is_some() || h.len() != 2 || m.len() != 2 || sec.len() != 2 {
        return None;
    }
    let (h, m, sec): (u64, u64, u64) = (h.parse().ok()?, m.parse().ok()?, sec.parse().ok()?);
    if !(1970..=9999).contains(&year) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let day: u64 = day;
    if day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let days = days_from_civil(year, month, day)?;
    Some(days * 86_400 + h * 3600 + m * 60 + sec)
}

/// Formats seconds since the Unix epoch as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn format_http_date(unix: u64) -> String {
    let days = unix / 86_400;
    let secs = unix % 86_400;
    let (y, m, d) = civil_from_days(days);
    let weekday = WEEKDAYS
        .get(usize::try_from(days % 7).unwrap_or(0))
        .copied()
        .unwrap_or("Thu");
    let month = MONTHS
        .get(usize::try_from(m.saturating_sub(1)).unwrap_or(0))
        .map_or("Jan", |m| {
            std::str::from_utf8(m.as_slice()).unwrap_or("Jan")
        });
    format!(
        "{weekday}, {d:02} {month} {y:04} {:02}:{:02}:{:02} GMT",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

fn is_leap(y: u64) -> bool {
    (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400)
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: u64, m: u64, d: u64) -> Option<u64> {
    let y = if m <= 2 { y.checked_sub(1)? } else { y };
    let era = y / 400;
    let yoe = y % 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).checked_sub(719_468)
}

fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn req(method: &str, headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: method.into(),
            target: "http://h/f".into(),
            version_minor: 1,
            headers: headers
                .iter()
                .map(|(n, v)| Header::new(n, v.as_bytes()))
                .collect(),
        }
    }

    fn resp(status: u16, headers: &[(&str, &str)]) -> ResponseHead {
        ResponseHead {
            version_minor: 1,
            status,
            reason: String::new(),
            headers: headers
                .iter()
                .map(|(n, v)| Header::new(n, v.as_bytes()))
                .collect(),
        }
    }

    fn lancache() -> CacheRule {
        CacheRule::new("r", &["*"])
    }

    fn rfc() -> CacheRule {
        CacheRule {
            respect_cache_control: true,
            ..CacheRule::new("r", &["*"])
        }
    }

    fn get() -> RequestHead {
        req("GET", &[])
    }

    fn check(rule: &CacheRule, headers: &[(&str, &str)]) -> Result<Freshness, Bypass> {
        check_response(&get(), &resp(200, headers), rule, 7 * DAY, u64::MAX)
    }

    fn ttl(rule: &CacheRule, headers: &[(&str, &str)]) -> u64 {
        check(rule, headers).unwrap().ttl.as_secs()
    }

    #[test]
    fn labels_are_unique_snake_case() {
        let labels: std::collections::HashSet<&str> =
            Bypass::ALL.iter().map(Bypass::label).collect();
        assert_eq!(labels.len(), Bypass::ALL.len());
        for l in labels {
            assert!(
                l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{l}"
            );
        }
        assert_eq!(Bypass::TooLarge.to_string(), "too_large");
    }

    #[test]
    fn request_checks() {
        let r = lancache();
        assert_eq!(check_request(&get(), &r), Ok(()));
        assert_eq!(check_request(&req("HEAD", &[]), &r), Err(Bypass::Method));
        assert_eq!(check_request(&req("POST", &[]), &r), Err(Bypass::Method));
        assert_eq!(check_request(&req("get", &[]), &r), Err(Bypass::Method));
        let head_too = CacheRule {
            methods: vec!["GET".into(), "HEAD".into()],
            ..lancache()
        };
        assert_eq!(check_request(&req("HEAD", &[]), &head_too), Ok(()));
        for h in [
            ("Content-Length", "5"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "websocket"),
        ] {
            assert_eq!(
                check_request(&req("GET", &[h]), &r),
                Err(Bypass::RequestBody)
            );
        }
        assert_eq!(
            check_request(&req("GET", &[("Content-Length", "0")]), &r),
            Ok(())
        );
        // no-store and Authorization: ignored in lancache mode
        let nostore = req("GET", &[("Cache-Control", "no-store")]);
        assert_eq!(check_request(&nostore, &r), Ok(()));
        assert_eq!(check_request(&nostore, &rfc()), Err(Bypass::RequestNoStore));
        let odd = req("GET", &[("cache-control", " max-age=0 ,  NO-STORE ")]);
        assert_eq!(check_request(&odd, &rfc()), Err(Bypass::RequestNoStore));
        let auth = req("GET", &[("Authorization", "Basic eDp5")]);
        assert_eq!(check_request(&auth, &rfc()), Ok(()));
    }

    #[test]
    fn fresh_copy_requests() {
        let yes = |h: &[(&str, &str)]| wants_fresh_copy(&req("GET", h), &rfc());
        assert!(yes(&[("Cache-Control", "no-cache")]));
        assert!(yes(&[("Cache-Control", "max-age=0")]));
        assert!(yes(&[("Pragma", "no-cache")]));
        assert!(!yes(&[
            ("Pragma", "no-cache"),
            ("Cache-Control", "max-age=60")
        ]));
        assert!(!yes(&[("Cache-Control", "max-age=60")]));
        assert!(!yes(&[]));
        assert!(!wants_fresh_copy(
            &req("GET", &[("Cache-Control", "no-cache")]),
            &lancache()
        ));
    }

    #[test]
    fn status_method_type_and_size() {
        let r = lancache();
        assert_eq!(ttl(&r, &[]), 30 * 86_400);
        for s in [201, 203, 204, 206, 301, 302, 304, 404, 410, 500] {
            assert_eq!(
                check_response(&get(), &resp(s, &[]), &r, DAY, u64::MAX),
                Err(Bypass::Status),
                "{s}"
            );
        }
        assert_eq!(
            check_response(&req("HEAD", &[]), &resp(200, &[]), &r, DAY, u64::MAX),
            Err(Bypass::Method)
        );
        let typed = CacheRule {
            content_types: vec!["application/".into(), "video/MP4".into()],
            ..lancache()
        };
        for ok in [
            "application/octet-stream",
            "Application/X-Debian-Package; charset=binary",
            " video/mp4 ",
            "video/mp4;codecs=avc1",
        ] {
            assert!(check(&typed, &[("Content-Type", ok)]).is_ok(), "{ok}");
        }
        for bad in ["video/mp4x", "text/html", "applicationx/y", "video/", ""] {
            assert_eq!(
                check(&typed, &[("Content-Type", bad)]),
                Err(Bypass::ContentType),
                "{bad}"
            );
        }
        assert_eq!(check(&typed, &[]), Err(Bypass::ContentType));

        let sized = CacheRule {
            max_size: 100,
            ..lancache()
        };
        let with_len = |rule: &CacheRule, len: &str, max: u64| {
            check_response(
                &get(),
                &resp(200, &[("Content-Length", len)]),
                rule,
                DAY,
                max,
            )
        };
        assert!(with_len(&sized, "100", 1000).is_ok());
        assert_eq!(with_len(&sized, "101", 1000), Err(Bypass::TooLarge));
        assert_eq!(with_len(&r, "1001", 1000), Err(Bypass::TooLarge));
        assert!(with_len(&r, "1000", 1000).is_ok());
        assert_eq!(with_len(&sized, "51", 50), Err(Bypass::TooLarge));
        // unknown length: the store enforces size_limit while writing
        assert!(with_len(&r, "lots", 10).is_ok());
        assert_eq!(size_limit(&sized, 1000), 100);
        assert_eq!(size_limit(&sized, 50), 50);
        assert_eq!(size_limit(&r, 50), 50);
    }

    #[test]
    fn lancache_mode_ignores_directives() {
        let r = lancache();
        let f = check(
            &r,
            &[
                ("Cache-Control", "private, no-store, no-cache, max-age=0"),
                ("Set-Cookie", "a=b"),
                ("Vary", "*"),
                ("Expires", "0"),
            ],
        )
        .unwrap();
        assert_eq!(f.ttl, r.ttl);
        assert!(f.vary.is_empty());
        let auth = req("GET", &[("Authorization", "Bearer x")]);
        assert!(check_response(&auth, &resp(200, &[]), &r, DAY, u64::MAX).is_ok());
    }

    #[test]
    fn respect_mode_bypasses() {
        let r = rfc();
        let cases: &[(&[(&str, &str)], Bypass)] = &[
            (&[("Cache-Control", "no-store")], Bypass::NoStore),
            (&[("Cache-Control", "max-age=60, private")], Bypass::Private),
            (
                &[("Cache-Control", "private=\"set-cookie, x-user\"")],
                Bypass::Private,
            ),
            (&[("Cache-Control", "no-cache")], Bypass::NoCache),
            (&[("Cache-Control", "No-Cache=\"x\"")], Bypass::NoCache),
            (&[("Set-Cookie", "sid=1")], Bypass::SetCookie),
            (&[("Vary", "Accept-Encoding, *")], Bypass::VaryStar),
            (&[("Cache-Control", "max-age=0")], Bypass::Expired),
            (&[("Cache-Control", "max-age=abc")], Bypass::Expired),
            (&[("Cache-Control", "max-age=-5")], Bypass::Expired),
            (
                &[("Cache-Control", "max-age=60"), ("Age", "60")],
                Bypass::Expired,
            ),
            (
                &[("Date", "Sun, 06 Nov 1994 08:49:37 GMT"), ("Expires", "0")],
                Bypass::Expired,
            ),
            (
                &[
                    ("Date", "Sun, 06 Nov 1994 08:49:37 GMT"),
                    ("Expires", "Sun, 06 Nov 1994 08:00:00 GMT"),
                ],
                Bypass::Expired,
            ),
        ];
        for (headers, want) in cases {
            assert_eq!(check(&r, headers), Err(*want), "{headers:?}");
        }
        // the quoted comma does not make `x-user` a directive, and `public` inside quotes is
        // not the public directive
        let cc = CacheControl::parse(
            [b"private=\"set-cookie, public\", max-age=5".as_slice()].into_iter(),
        );
        assert!(cc.private && !cc.public);
        assert_eq!(cc.max_age, Some(5));
    }

    #[test]
    fn authorization_needs_explicit_sharing() {
        let r = rfc();
        let auth = req("GET", &[("Authorization", "Basic eDp5")]);
        let with = |h: &[(&str, &str)]| check_response(&auth, &resp(200, h), &r, DAY, u64::MAX);
        assert_eq!(with(&[]), Err(Bypass::Authorization));
        assert_eq!(
            with(&[("Cache-Control", "max-age=60")]),
            Err(Bypass::Authorization)
        );
        assert_eq!(with(&[("Cache-Control", "public")]).unwrap().ttl, DAY);
        assert_eq!(
            with(&[("Cache-Control", "s-maxage=60")])
                .unwrap()
                .ttl
                .as_secs(),
            60
        );
        assert!(with(&[("Cache-Control", "must-revalidate, max-age=9")]).is_ok());
    }

    #[test]
    fn lifetimes() {
        let r = rfc();
        // no information → default_ttl (7 days here), capped by the rule ttl (30 days)
        assert_eq!(ttl(&r, &[]), 7 * 86_400);
        let short = CacheRule {
            ttl: Duration::from_secs(100),
            ..rfc()
        };
        assert_eq!(ttl(&short, &[]), 100);
        assert_eq!(ttl(&short, &[("Cache-Control", "max-age=3600")]), 100);
        assert_eq!(ttl(&r, &[("Cache-Control", "max-age=3600")]), 3600);
        assert_eq!(
            ttl(&r, &[("Cache-Control", "\"max-age\"=5, max-age=\"60\"")]),
            60
        );
        assert_eq!(
            ttl(&r, &[("Cache-Control", "max-age=3600, s-maxage=60")]),
            60
        );
        assert_eq!(
            ttl(&r, &[("cache-control", "MAX-AGE = 120"), ("Age", "20")]),
            100
        );
        // two lines, same value: fine; conflicting: stale
        assert_eq!(
            ttl(
                &r,
                &[
                    ("Cache-Control", "max-age=60"),
                    ("Cache-Control", "max-age=60")
                ]
            ),
            60
        );
        assert_eq!(
            check(&r, &[("Cache-Control", "max-age=60, max-age=120")]),
            Err(Bypass::Expired)
        );
        // overflow: clamped to 2^31 s, then capped by the rule ttl
        assert_eq!(
            ttl(
                &r,
                &[("Cache-Control", "max-age=99999999999999999999999999")]
            ),
            30 * 86_400
        );
        let long = CacheRule {
            ttl: Duration::from_secs(u64::MAX / 4),
            ..rfc()
        };
        assert_eq!(
            ttl(
                &long,
                &[("Cache-Control", "max-age=99999999999999999999999999")]
            ),
            1 << 31
        );
        // Expires relative to Date; ignored without Date (default applies)
        let date = ("Date", "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            ttl(&r, &[date, ("Expires", "Sun, 06 Nov 1994 09:49:37 GMT")]),
            3600
        );
        assert_eq!(
            ttl(&r, &[("Expires", "Sun, 06 Nov 1994 09:49:37 GMT")]),
            7 * 86_400
        );
        // max-age beats Expires
        assert_eq!(
            ttl(
                &r,
                &[
                    date,
                    ("Expires", "Sun, 06 Nov 1994 09:49:37 GMT"),
                    ("Cache-Control", "max-age=10")
                ]
            ),
            10
        );
        // heuristic: 10 % of Date - Last-Modified (10 days → 1 day)
        assert_eq!(
            ttl(
                &r,
                &[date, ("Last-Modified", "Thu, 27 Oct 1994 08:49:37 GMT")]
            ),
            86_400
        );
        assert_eq!(
            check(
                &r,
                &[date, ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")]
            ),
            Err(Bypass::Expired)
        );
    }

    #[test]
    fn vary_and_variant_keys() {
        let r = rfc();
        let f = check(
            &r,
            &[
                ("Vary", "Accept-Encoding,  accept-language"),
                ("Vary", "ACCEPT-ENCODING"),
            ],
        )
        .unwrap();
        assert_eq!(f.vary, ["accept-encoding", "accept-language"]);
        let base = "http://h/f";
        assert_eq!(variant_key(base, &[], &get()), base);
        let a = req(
            "GET",
            &[("Accept-Encoding", "gzip,  br"), ("accept-language", "de")],
        );
        assert_eq!(
            variant_key(base, &f.vary, &a),
            "http://h/f#vary(accept-encoding=gzip,br;accept-language=de)"
        );
        let two_lines = req(
            "GET",
            &[
                ("Accept-Encoding", "gzip"),
                ("accept-language", "de"),
                ("Accept-Encoding", "br"),
            ],
        );
        assert_eq!(
            variant_key(base, &f.vary, &two_lines),
            variant_key(base, &f.vary, &a)
        );
        let missing = req("GET", &[("Accept-Encoding", "")]);
        assert_eq!(
            variant_key(base, &f.vary, &missing),
            "http://h/f#vary(accept-encoding=;accept-language)"
        );
        let odd = req("GET", &[("Accept-Language", "a;b=c (x)#é")]);
        assert_eq!(
            variant_key(base, &["accept-language".into()], &odd),
            "http://h/f#vary(accept-language=a%3Bb%3Dc%20%28x%29%23%C3%A9)"
        );
    }

    #[test]
    fn stored_headers_drop_cookies_hop_by_hop_and_framing() {
        let r = resp(
            200,
            &[
                ("Content-Type", "application/octet-stream"),
                ("Connection", "keep-alive, X-Hop"),
                ("X-Hop", "1"),
                ("Keep-Alive", "timeout=5"),
                ("Set-Cookie", "a=b"),
                ("Content-Length", "10"),
                ("Transfer-Encoding", "chunked"),
                ("Age", "5"),
                ("ETag", "\"abc\""),
                ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ],
        );
        let names: Vec<String> = stored_headers(&r).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["Content-Type", "ETag", "Last-Modified"]);
    }

    #[test]
    fn http_dates() {
        let t = 784_111_777; // Sun, 06 Nov 1994 08:49:37 GMT
        for s in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "  Sun, 06 Nov 1994 08:49:37 GMT ",
        ] {
            assert_eq!(parse_http_date(s.as_bytes()), Some(t), "{s}");
        }
        assert_eq!(format_http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(format_http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(parse_http_date(b"Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date(b"Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(951_825_600)
        );
        assert_eq!(
            parse_http_date(b"Monday, 01-Jan-30 00:00:00 GMT"),
            Some(1_893_456_000)
        );
        for bad in [
            "",
            "0",
            "-1",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 31 Feb 1994 08:49:37 GMT",
            "Sun, 29 Feb 1900 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 99999999999999999999 Nov 1994 08:49:37 GMT",
            "Sun, 06-Nov-1994 08:49:37 GMT",
            "Sun Nov  6 08:49:37",
        ] {
            assert_eq!(parse_http_date(bad.as_bytes()), None, "{bad}");
        }
        // round trips over a range of days, including leap years
        for days in (0..200_000u64).step_by(97) {
            let t = days * 86_400 + 12_345;
            assert_eq!(parse_http_date(format_http_date(t).as_bytes()), Some(t));
        }
    }
}
