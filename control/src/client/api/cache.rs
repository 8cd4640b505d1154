//! The client's local HTTP cache: the server's cache engine (store, rules, presets), reported in
//! the client API's shapes. Entry listing and removal are the server API's code.

use super::S;
use crate::api::cache::EntriesQuery;
use crate::api::error::ApiError;
use axum::extract::{Path, Query, State};
use axum::Json;
use std::sync::atomic::Ordering::Relaxed;
use switchyard_api::client::{ClientCacheStats, StatusReply};
use switchyard_api::{CacheEntryDeleted, CacheEntryList};
use switchyard_dataplane::cache::Tier;

#[utoipa::path(get, path = "/api/v1/cache/stats", tag = "cache", responses((status = 200, body = ClientCacheStats)))]
pub async fn stats(State(state): State<S>) -> Json<ClientCacheStats> {
    let cfg = state.config.load();
    let rules_count = state
        .snapshot
        .load()
        .cache
        .as_ref()
        .map_or(0, |p| p.rules.len() as u64);
    let presets_count = cfg.cache.presets.len() as u64;
    let custom_rules_count = cfg.cache.rules.len() as u64;
    let Some(store) = &state.cache else {
        return Json(ClientCacheStats {
            enabled: false,
            storage_type: cfg.cache.storage.r#type.api_name().to_owned(),
            entries: 0,
            total_size_bytes: 0,
            max_size_bytes: 0,
            used_percent: 0.0,
            hit_count: 0,
            miss_count: 0,
            hit_rate: 0.0,
            eviction_count: 0,
            store_error_count: 0,
            rules_count,
            presets_count,
            custom_rules_count,
        });
    };
    let (memory, disk) = (store.usage(Tier::Memory), store.usage(Tier::Disk));
    let size = memory.size_bytes + disk.size_bytes;
    let max = memory.max_size_bytes + disk.max_size_bytes;
    let hits = store.stats.hits();
    let misses = store.stats.misses();
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Json(ClientCacheStats {
        enabled: true,
        storage_type: store.settings.kind.label().to_owned(),
        entries: memory.entries + disk.entries,
        total_size_bytes: size,
        max_size_bytes: max,
        used_percent: ratio(size, max) * 100.0,
        hit_count: hits,
        miss_count: misses,
        hit_rate: ratio(hits, hits + misses),
        eviction_count: store.stats.evictions.load(Relaxed),
        store_error_count: store.stats.store_errors.load(Relaxed),
        rules_count,
        presets_count,
        custom_rules_count,
    })
}

#[utoipa::path(get, path = "/api/v1/cache/entries", tag = "cache", params(EntriesQuery),
    responses((status = 200, body = CacheEntryList), (status = 400, body = switchyard_api::ErrorBody), (status = 404, description = "caching is off", body = switchyard_api::ErrorBody)))]
pub async fn entries(
    State(state): State<S>,
    Query(q): Query<EntriesQuery>,
) -> Result<Json<CacheEntryList>, ApiError> {
    crate::api::cache::list_entries(state.cache.as_ref(), q).map(Json)
}

#[utoipa::path(delete, path = "/api/v1/cache/entries/{key}", tag = "cache", params(("key" = String, Path)),
    responses((status = 200, body = CacheEntryDeleted), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn delete_entry(
    State(state): State<S>,
    Path(key): Path<String>,
) -> Result<Json<CacheEntryDeleted>, ApiError> {
    crate::api::cache::remove_entry(state.cache.clone(), key)
        .await
        .map(Json)
}

#[utoipa::path(post, path = "/api/v1/cache/clear", tag = "cache",
    responses((status = 200, body = StatusReply), (status = 404, description = "caching is off", body = switchyard_api::ErrorBody)))]
pub async fn clear(State(state): State<S>) -> Result<Json<StatusReply>, ApiError> {
    let store = state
        .cache
        .clone()
        .ok_or_else(crate::api::cache::no_cache)?;
    let removed = tokio::task::spawn_blocking(move || store.remove_where(|_| true))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    tracing::info!(removed, "client cache cleared through the API");
    Ok(Json(StatusReply::new("cleared")))
}
