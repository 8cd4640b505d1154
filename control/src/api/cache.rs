//! `/api/v1/cache/*`: statistics, stored entries (list, one, delete, clear, by domain), rules and
//! presets. Entries are read from and removed in the data plane's shared store; rule and preset
//! changes go through the running configuration and reach the data plane with the next snapshot
//! (hot reload), like route changes.

use super::backends::mutate_error;
use super::error::{ApiError, ApiJson};
use crate::config_store::mutate;
use crate::server::ServerState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, TimeZone, Utc};
use serde::Deserialize;
use std::sync::Arc;
use switchyard_api::{
    CacheDomainDeleted, CacheEntry, CacheEntryDeleted, CacheEntryList, CachePreset,
    CachePresetChanged, CachePresetList, CachePresetToggle, CacheRule, CacheRuleDeleted,
    CacheRuleInput, CacheRuleList, CacheRuleSaved, CacheStats, CacheTierStats, MessageWithTime,
};
use switchyard_config::cache::CacheRuleConfig;
use switchyard_config::units::{Duration as ConfigDuration, Size};
use switchyard_dataplane::cache::store::EvictReason;
use switchyard_dataplane::cache::{EntryInfo, Tier};
use switchyard_proto::cache::presets;
use switchyard_proto::route_matcher::DomainPattern;

const DEFAULT_LIMIT: u64 = 100;
const MAX_LIMIT: u64 = 1000;

fn time(unix: u64) -> DateTime<Utc> {
    Utc.timestamp_opt(i64::try_from(unix).unwrap_or(i64::MAX), 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn entry_view(e: EntryInfo) -> CacheEntry {
    CacheEntry {
        key: e.key,
        url: e.url,
        host: e.host,
        size: e.size,
        content_type: e.content_type,
        created_at: time(e.created_unix),
        expires_at: time(e.expires_unix),
        tier: e.tier.label().to_owned(),
    }
}

pub(crate) fn no_cache() -> ApiError {
    ApiError::not_found(
        "CACHE_DISABLED",
        "the HTTP cache is off (cache.enabled: false); enabling it needs a restart",
    )
}

#[utoipa::path(get, path = "/api/v1/cache/stats", tag = "cache", responses((status = 200, body = CacheStats)))]
pub async fn stats(State(state): State<Arc<ServerState>>) -> Json<CacheStats> {
    let cfg = state.config.load();
    let rules_count = state
        .snapshot
        .load()
        .cache
        .as_ref()
        .map_or(0, |p| p.rules.len() as u64);
    let empty = CacheTierStats {
        entries: 0,
        size_bytes: 0,
        max_size_bytes: 0,
    };
    let Some(store) = &state.cache else {
        return Json(CacheStats {
            enabled: false,
            hit_rate: 0.0,
            total_requests: 0,
            cache_hits: 0,
            cache_misses: 0,
            storage_type: cfg.cache.storage.r#type.api_name().to_owned(),
            rules_count,
            memory: empty.clone(),
            disk: empty,
            store_errors: 0,
            evictions: 0,
        });
    };
    use std::sync::atomic::Ordering::Relaxed;
    let hits = store.stats.hits();
    let misses = store.stats.misses();
    let tier = |t: Tier| {
        let u = store.usage(t);
        CacheTierStats {
            entries: u.entries,
            size_bytes: u.size_bytes,
            max_size_bytes: u.max_size_bytes,
        }
    };
    let total = hits + misses;
    Json(CacheStats {
        enabled: true,
        hit_rate: if total == 0 {
            0.0
        } else {
            hits as f64 / total as f64
        },
        total_requests: total,
        cache_hits: hits,
        cache_misses: misses,
        storage_type: store.settings.kind.label().to_owned(),
        rules_count,
        memory: tier(Tier::Memory),
        disk: tier(Tier::Disk),
        store_errors: store.stats.store_errors.load(Relaxed),
        evictions: store.stats.evictions.load(Relaxed),
    })
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct EntriesQuery {
    /// Domain pattern (`example.com`, `*.example.com`, `cdn*.example.com`, `*`).
    domain: Option<String>,
    /// Default 100, at most 1000.
    limit: Option<u64>,
    offset: Option<u64>,
}

fn domain_filter(domain: Option<&str>) -> Result<Option<DomainPattern>, ApiError> {
    match domain {
        None | Some("") => Ok(None),
        Some(d) => DomainPattern::parse(d)
            .map(Some)
            .map_err(|e| ApiError::bad_request("INVALID_DOMAIN", e.to_string())),
    }
}

#[utoipa::path(get, path = "/api/v1/cache/entries", tag = "cache", params(EntriesQuery),
    responses((status = 200, body = CacheEntryList), (status = 400, body = switchyard_api::ErrorBody),
              (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn entries(
    State(state): State<Arc<ServerState>>,
    Query(q): Query<EntriesQuery>,
) -> Result<Json<CacheEntryList>, ApiError> {
    list_entries(state.cache.as_ref(), q).map(Json)
}

/// One page of entries (shared with the client API).
pub(crate) fn list_entries(
    store: Option<&Arc<switchyard_dataplane::cache::CacheStore>>,
    q: EntriesQuery,
) -> Result<CacheEntryList, ApiError> {
    let store = store.ok_or_else(no_cache)?;
    let pattern = domain_filter(q.domain.as_deref())?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let offset = q.offset.unwrap_or(0);
    let (page, total) = store.list(
        |host| pattern.as_ref().is_none_or(|p| p.matches(host)),
        usize::try_from(offset).unwrap_or(usize::MAX),
        usize::try_from(limit).unwrap_or(usize::MAX),
    );
    Ok(CacheEntryList {
        entries: page.into_iter().map(entry_view).collect(),
        total: total as u64,
        offset,
        limit,
    })
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ClearQuery {
    /// Must be `true`.
    confirm: Option<bool>,
}

#[utoipa::path(delete, path = "/api/v1/cache/entries", tag = "cache", params(ClearQuery),
    responses((status = 200, body = MessageWithTime), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn clear(
    State(state): State<Arc<ServerState>>,
    Query(q): Query<ClearQuery>,
) -> Result<Json<MessageWithTime>, ApiError> {
    if q.confirm != Some(true) {
        return Err(ApiError::bad_request(
            "CONFIRMATION_REQUIRED",
            "clearing the whole cache needs ?confirm=true",
        ));
    }
    let store = state.cache.clone().ok_or_else(no_cache)?;
    let removed = tokio::task::spawn_blocking(move || store.remove_where(|_| true))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    tracing::info!(removed, "cache cleared through the API");
    Ok(Json(MessageWithTime {
        message: format!("cache cleared ({removed} entries removed)"),
        time: Utc::now(),
    }))
}

#[utoipa::path(get, path = "/api/v1/cache/entries/{key}", tag = "cache", params(("key" = String, Path)),
    responses((status = 200, body = CacheEntry), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn entry(
    State(state): State<Arc<ServerState>>,
    Path(key): Path<String>,
) -> Result<Json<CacheEntry>, ApiError> {
    let store = state.cache.as_ref().ok_or_else(no_cache)?;
    store
        .peek(&key)
        .map(|e| Json(entry_view(e)))
        .ok_or_else(|| ApiError::not_found("ENTRY_NOT_FOUND", format!("no cache entry {key}")))
}

#[utoipa::path(delete, path = "/api/v1/cache/entries/{key}", tag = "cache", params(("key" = String, Path)),
    responses((status = 200, body = CacheEntryDeleted), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn delete_entry(
    State(state): State<Arc<ServerState>>,
    Path(key): Path<String>,
) -> Result<Json<CacheEntryDeleted>, ApiError> {
    remove_entry(state.cache.clone(), key).await.map(Json)
}

/// Removes one entry (shared with the client API).
pub(crate) async fn remove_entry(
    store: Option<Arc<switchyard_dataplane::cache::CacheStore>>,
    key: String,
) -> Result<CacheEntryDeleted, ApiError> {
    let store = store.ok_or_else(no_cache)?;
    let k = key.clone();
    let removed = tokio::task::spawn_blocking(move || store.remove(&k, EvictReason::Purged))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    if !removed {
        return Err(ApiError::not_found(
            "ENTRY_NOT_FOUND",
            format!("no cache entry {key}"),
        ));
    }
    Ok(CacheEntryDeleted {
        message: "cache entry deleted".into(),
        key,
    })
}

#[utoipa::path(delete, path = "/api/v1/cache/domain/{domain}", tag = "cache", params(("domain" = String, Path)),
    responses((status = 200, body = CacheDomainDeleted), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn delete_domain(
    State(state): State<Arc<ServerState>>,
    Path(domain): Path<String>,
) -> Result<Json<CacheDomainDeleted>, ApiError> {
    let store = state.cache.clone().ok_or_else(no_cache)?;
    let pattern = domain_filter(Some(&domain))?
        .ok_or_else(|| ApiError::bad_request("INVALID_DOMAIN", "domain is empty"))?;
    let deleted = tokio::task::spawn_blocking(move || store.remove_where(|h| pattern.matches(h)))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    tracing::info!(%domain, deleted, "cache entries deleted by domain through the API");
    Ok(Json(CacheDomainDeleted {
        message: format!("{deleted} cache entries deleted"),
        domain,
        deleted,
    }))
}

fn rule_view(r: &switchyard_proto::cache::rules::CacheRule) -> CacheRule {
    CacheRule {
        name: r.name.clone(),
        domains: r.domains.clone(),
        enabled: r.enabled,
        ttl: ConfigDuration(r.ttl).to_string(),
        priority: r.priority,
        preset: r.preset.clone(),
        ignore_query: r.ignore_query,
        content_types: r.content_types.clone(),
        respect_cache_control: r.respect_cache_control,
        methods: r.methods.clone(),
        max_size: Size(r.max_size).to_string(),
    }
}

fn config_rule_view(r: &CacheRuleConfig) -> CacheRule {
    CacheRule {
        name: r.name.clone(),
        domains: r.domains.clone(),
        enabled: r.enabled,
        ttl: r.ttl.to_string(),
        priority: r.priority,
        preset: None,
        ignore_query: r.ignore_query,
        content_types: r.content_types.clone(),
        respect_cache_control: r.respect_cache_control,
        methods: r.methods.clone(),
        max_size: r.max_size.to_string(),
    }
}

#[utoipa::path(get, path = "/api/v1/cache/rules", tag = "cache", responses((status = 200, body = CacheRuleList)))]
pub async fn rules(State(state): State<Arc<ServerState>>) -> Json<CacheRuleList> {
    let cfg = state.config.load();
    let mut rules: Vec<CacheRule> = cfg.cache.rules.iter().map(config_rule_view).collect();
    for name in &cfg.cache.presets {
        if let Some(p) = presets::find(name) {
            rules.push(rule_view(
                &switchyard_proto::cache::rules::CacheRule::from_preset(p),
            ));
        }
    }
    let count = rules.len() as u64;
    Json(CacheRuleList { rules, count })
}

fn parse_value<T>(
    field: &str,
    v: &serde_json::Value,
    parse: impl Fn(&str) -> Result<T, switchyard_config::units::UnitError>,
    from_number: impl Fn(u64) -> T,
) -> Result<T, ApiError> {
    match v {
        serde_json::Value::String(s) => parse(s)
            .map_err(|e| ApiError::bad_request("INVALID_CACHE_RULE", format!("{field}: {e}"))),
        serde_json::Value::Number(n) => n.as_u64().map(from_number).ok_or_else(|| {
            ApiError::bad_request("INVALID_CACHE_RULE", format!("{field}: not a whole number"))
        }),
        _ => Err(ApiError::bad_request(
            "INVALID_CACHE_RULE",
            format!("{field}: expected a string or a number"),
        )),
    }
}

/// Applies the fields given in `input` to `rule`.
fn apply_input(rule: &mut CacheRuleConfig, input: CacheRuleInput) -> Result<(), ApiError> {
    if let Some(v) = input.domains {
        rule.domains = v;
    }
    if let Some(v) = input.enabled {
        rule.enabled = v;
    }
    if let Some(v) = &input.ttl {
        rule.ttl = parse_value("ttl", v, ConfigDuration::parse, |n| {
            ConfigDuration(std::time::Duration::from_nanos(n))
        })?;
    }
    if let Some(v) = input.priority {
        rule.priority = v;
    }
    if let Some(v) = input.ignore_query {
        rule.ignore_query = v;
    }
    if let Some(v) = input.content_types {
        rule.content_types = v;
    }
    if let Some(v) = input.respect_cache_control {
        rule.respect_cache_control = v;
    }
    if let Some(v) = input.methods {
        rule.methods = v;
    }
    if let Some(v) = &input.max_size {
        rule.max_size = parse_value("max_size", v, Size::parse, Size)?;
    }
    Ok(())
}

fn is_preset_name(name: &str) -> bool {
    presets::find(name).is_some()
}

#[utoipa::path(post, path = "/api/v1/cache/rules", tag = "cache", request_body = CacheRuleInput,
    responses((status = 201, body = CacheRuleSaved), (status = 400, body = switchyard_api::ErrorBody),
              (status = 409, body = switchyard_api::ErrorBody)))]
pub async fn create_rule(
    State(state): State<Arc<ServerState>>,
    ApiJson(mut input): ApiJson<CacheRuleInput>,
) -> Result<(StatusCode, Json<CacheRuleSaved>), ApiError> {
    let name = input
        .name
        .take()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("INVALID_CACHE_RULE", "name is required"))?;
    if input.domains.as_ref().is_none_or(|d| d.is_empty()) {
        return Err(ApiError::bad_request(
            "INVALID_CACHE_RULE",
            "domains is required (at least one pattern)",
        ));
    }
    if is_preset_name(&name) {
        return Err(ApiError::conflict(
            "CACHE_RULE_EXISTS",
            format!("{name} is a built-in preset; enable it with POST /api/v1/cache/presets/{name}/enable"),
        ));
    }
    let mut rule = CacheRuleConfig::new(&name, &[]);
    apply_input(&mut rule, input)?;
    let view = config_rule_view(&rule);
    mutate(&state, |cfg| {
        if cfg.cache.rules.iter().any(|r| r.name == rule.name) {
            return Err(ApiError::conflict(
                "CACHE_RULE_EXISTS",
                format!("cache rule {} already exists", rule.name),
            ));
        }
        cfg.cache.rules.push(rule);
        Ok(())
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_CACHE_RULE"))?;
    tracing::info!(rule = %name, "cache rule created through the API");
    Ok((
        StatusCode::CREATED,
        Json(CacheRuleSaved {
            message: "cache rule created".into(),
            rule: view,
        }),
    ))
}

#[utoipa::path(put, path = "/api/v1/cache/rules/{name}", tag = "cache", params(("name" = String, Path)),
    request_body = CacheRuleInput,
    responses((status = 200, body = CacheRuleSaved), (status = 400, body = switchyard_api::ErrorBody),
              (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn update_rule(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
    ApiJson(input): ApiJson<CacheRuleInput>,
) -> Result<Json<CacheRuleSaved>, ApiError> {
    if input.name.as_ref().is_some_and(|n| *n != name) {
        return Err(ApiError::bad_request(
            "INVALID_CACHE_RULE",
            "a rule cannot be renamed; delete it and create a new one",
        ));
    }
    let view = mutate(&state, |cfg| {
        let Some(rule) = cfg.cache.rules.iter_mut().find(|r| r.name == name) else {
            return Err(not_found_rule(&name));
        };
        apply_input(rule, input)?;
        Ok(config_rule_view(rule))
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_CACHE_RULE"))?;
    tracing::info!(rule = %name, "cache rule updated through the API");
    Ok(Json(CacheRuleSaved {
        message: "cache rule updated".into(),
        rule: view,
    }))
}

fn not_found_rule(name: &str) -> ApiError {
    if is_preset_name(name) {
        ApiError::not_found(
            "CACHE_RULE_NOT_FOUND",
            format!("{name} is a preset, not a custom rule; use /api/v1/cache/presets/{name}"),
        )
    } else {
        ApiError::not_found(
            "CACHE_RULE_NOT_FOUND",
            format!("cache rule {name} does not exist"),
        )
    }
}

#[utoipa::path(delete, path = "/api/v1/cache/rules/{name}", tag = "cache", params(("name" = String, Path)),
    responses((status = 200, body = CacheRuleDeleted), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn delete_rule(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
) -> Result<Json<CacheRuleDeleted>, ApiError> {
    mutate(&state, |cfg| {
        let Some(i) = cfg.cache.rules.iter().position(|r| r.name == name) else {
            return Err(not_found_rule(&name));
        };
        cfg.cache.rules.remove(i);
        Ok(())
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_CACHE_RULE"))?;
    tracing::info!(rule = %name, "cache rule deleted through the API");
    Ok(Json(CacheRuleDeleted {
        message: "cache rule deleted".into(),
        rule: name,
    }))
}

#[utoipa::path(get, path = "/api/v1/cache/presets", tag = "cache", responses((status = 200, body = CachePresetList)))]
pub async fn presets_list(State(state): State<Arc<ServerState>>) -> Json<CachePresetList> {
    let cfg = state.config.load();
    let presets: Vec<CachePreset> = presets::all()
        .iter()
        .map(|p| CachePreset {
            name: p.name.to_owned(),
            description: p.description.to_owned(),
            domains: p.domains.iter().map(|d| (*d).to_owned()).collect(),
            ttl: ConfigDuration(p.ttl).to_string(),
            priority: p.priority,
            enabled: cfg.cache.presets.iter().any(|n| n == p.name),
        })
        .collect();
    let count = presets.len() as u64;
    Json(CachePresetList { presets, count })
}

async fn set_preset(
    state: &ServerState,
    name: String,
    enabled: bool,
) -> Result<Json<CachePresetChanged>, ApiError> {
    if !is_preset_name(&name) {
        return Err(ApiError::not_found(
            "PRESET_NOT_FOUND",
            format!("no preset named {name} (GET /api/v1/cache/presets lists them)"),
        ));
    }
    mutate(state, |cfg| {
        let listed = cfg.cache.presets.iter().position(|n| *n == name);
        match (listed, enabled) {
            (None, true) => cfg.cache.presets.push(name.clone()),
            (Some(i), false) => {
                cfg.cache.presets.remove(i);
            }
            _ => {}
        }
        Ok::<_, ApiError>(())
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_PRESET"))?;
    let verb = if enabled { "enabled" } else { "disabled" };
    tracing::info!(preset = %name, verb, "cache preset changed through the API");
    Ok(Json(CachePresetChanged {
        message: format!("preset {verb}"),
        preset: name,
        enabled,
    }))
}

#[utoipa::path(post, path = "/api/v1/cache/presets/{name}/enable", tag = "cache", params(("name" = String, Path)),
    responses((status = 200, body = CachePresetChanged), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn enable_preset(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
) -> Result<Json<CachePresetChanged>, ApiError> {
    set_preset(&state, name, true).await
}

#[utoipa::path(post, path = "/api/v1/cache/presets/{name}/disable", tag = "cache", params(("name" = String, Path)),
    responses((status = 200, body = CachePresetChanged), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn disable_preset(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
) -> Result<Json<CachePresetChanged>, ApiError> {
    set_preset(&state, name, false).await
}

#[utoipa::path(post, path = "/api/v1/cache/presets/{name}", tag = "cache", params(("name" = String, Path)),
    request_body = CachePresetToggle,
    responses((status = 200, body = CachePresetChanged), (status = 400, body = switchyard_api::ErrorBody),
              (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn toggle_preset(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<CachePresetToggle>,
) -> Result<Json<CachePresetChanged>, ApiError> {
    set_preset(&state, name, body.enabled).await
}
