//! The client configuration over the API: read, partial update, validate, reload from disk,
//! defaults, export and import. A change is validated and compiled before anything is saved;
//! an invalid one answers `{valid: false, errors}` and changes nothing.

use super::{invalid, S};
use crate::api::body::{ConfigFileBytes, JsonBytes, TypedBody};
use crate::api::error::ApiError;
use crate::client::state::ClientState;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use switchyard_api::client::{ConfigError, ConfigUpdated, ConfigValidation, StatusReply};
use switchyard_config::client::{merge_partial, restart_fields, validate_client, ClientConfig};

/// The full configuration as JSON (field names are the YAML keys; durations are strings).
#[utoipa::path(get, path = "/api/v1/config", tag = "config",
    responses((status = 200, description = "the running ClientConfig", body = Object)))]
pub async fn get(State(state): State<S>) -> Json<ClientConfig> {
    Json(switchyard_config::client::masked(&state.config.load_full()))
}

/// What a change would need: restart warnings and notes on features not in this build.
fn warnings(old: &ClientConfig, new: &ClientConfig) -> (Vec<String>, Vec<String>) {
    let restart = restart_fields(old, new);
    let mut warnings: Vec<String> = restart
        .iter()
        .map(|f| format!("{f} changed: restart the client to apply it"))
        .collect();
    if new.vpn.enabled != old.vpn.enabled {
        warnings
            .push("vpn.enabled: POST /api/v1/vpn/enable or /disable switches the VPN now".into());
    }
    if new.mesh.enabled != old.mesh.enabled {
        warnings.push(
            "mesh.enabled: POST /api/v1/mesh/enable or /disable switches the mesh peer now".into(),
        );
    }
    (restart, warnings)
}

/// The validation body of a configuration that does not even parse.
fn unparsable(message: String) -> ConfigValidation {
    ConfigValidation {
        valid: false,
        errors: vec![ConfigError {
            section: message
                .split(['.', '[', ':'])
                .next()
                .unwrap_or_default()
                .to_owned(),
            message: message.clone(),
        }],
        warnings: Vec::new(),
        message: Some(message),
    }
}

fn bad_body(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(unparsable(message))).into_response()
}

async fn apply(state: &ClientState, new: ClientConfig, status: &str, save: bool) -> Response {
    let _guard = state.config_write.lock().await;
    let old = state.config.load_full();
    let (_, mut warnings) = warnings(&old, &new);
    let split = (new.vpn.split != old.vpn.split).then(|| new.vpn.split.clone());
    match state.apply_config(new, save) {
        Ok(restart) => {
            // a running VPN takes changed split rules (allow_lan included) at once, as the
            // /api/v1/vpn/split endpoints do
            if let Some(split) = split {
                if let Err(e) = state.vpn.apply_split(&split).await {
                    tracing::warn!(error = %e, "the running VPN refused the new split rules");
                    warnings.push(format!(
                        "vpn.split: saved, but the running VPN refused it ({e}); it applies at the next enable"
                    ));
                }
            }
            Json(ConfigUpdated {
                status: status.into(),
                restart_required: !restart.is_empty(),
                restart_fields: restart,
                warnings,
            })
            .into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Applies a partial configuration (only the keys to change) and saves the result.
#[utoipa::path(put, path = "/api/v1/config", tag = "config",
    request_body(content = Object, description = "partial ClientConfig"),
    responses((status = 200, body = ConfigUpdated), (status = 400, body = ConfigValidation),
              (status = 415, description = "a body not sent as application/json", body = switchyard_api::ErrorBody)))]
pub async fn put(State(state): State<S>, TypedBody(body, _): JsonBytes) -> Response {
    let partial: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_body(format!("body is not JSON: {e}")),
    };
    let new = match merge_partial(&state.config.load(), &partial) {
        Ok(c) => c,
        Err(e) => return bad_body(e),
    };
    apply(&state, new, "updated", true).await
}

/// Reads the configuration file again and applies it.
#[utoipa::path(post, path = "/api/v1/config/reload", tag = "config",
    responses((status = 200, body = StatusReply), (status = 400, body = ConfigValidation)))]
pub async fn reload(State(state): State<S>) -> Response {
    let new = if state.config_path.exists() {
        match ClientConfig::load_file(&state.config_path) {
            Ok(c) => c,
            Err(e) => return bad_body(e.to_string()),
        }
    } else {
        ClientConfig::default()
    };
    let _guard = state.config_write.lock().await;
    match state.apply_config(new, false) {
        Ok(restart) => {
            if !restart.is_empty() {
                tracing::warn!(fields = ?restart, "reloaded; these changes apply after a restart");
            }
            Json(StatusReply::new("reloaded")).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Checks a partial configuration against the running one; changes nothing.
#[utoipa::path(post, path = "/api/v1/config/validate", tag = "config",
    request_body(content = Object, description = "partial ClientConfig"),
    responses((status = 200, body = ConfigValidation),
              (status = 415, description = "a body not sent as application/json", body = switchyard_api::ErrorBody)))]
pub async fn validate(
    State(state): State<S>,
    TypedBody(body, _): JsonBytes,
) -> Json<ConfigValidation> {
    let old = state.config.load_full();
    let merged = serde_json::from_slice::<serde_json::Value>(&body)
        .map_err(|e| format!("body is not JSON: {e}"))
        .and_then(|partial| merge_partial(&old, &partial));
    let new = match merged {
        Ok(c) => c,
        Err(message) => return Json(unparsable(message)),
    };
    let problems = validate_client(&new);
    let (_, warnings) = warnings(&old, &new);
    if !problems.is_empty() {
        let mut v = invalid(&problems);
        v.warnings = warnings;
        return Json(v);
    }
    Json(ConfigValidation {
        valid: true,
        errors: Vec::new(),
        warnings,
        message: None,
    })
}

/// The built-in defaults (the configuration of an empty file).
#[utoipa::path(get, path = "/api/v1/config/defaults", tag = "config",
    responses((status = 200, description = "the default ClientConfig", body = Object)))]
pub async fn defaults() -> Json<ClientConfig> {
    Json(ClientConfig::default())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct FormatQuery {
    /// `yaml` (default) or `json`.
    format: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Format {
    Yaml,
    Json,
}

fn format_of(q: &FormatQuery) -> Result<Format, ApiError> {
    match q.format.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("yaml") | Some("yml") => Ok(Format::Yaml),
        Some("json") => Ok(Format::Json),
        Some(other) => Err(ApiError::bad_request(
            "UNKNOWN_FORMAT",
            format!("format {other:?}: use yaml or json"),
        )),
    }
}

/// The running configuration as a file download.
#[utoipa::path(post, path = "/api/v1/config/export", tag = "config", params(FormatQuery),
    responses((status = 200, description = "attachment switchyard-client.yaml or .json"), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn export(
    State(state): State<S>,
    Query(q): Query<FormatQuery>,
) -> Result<Response, ApiError> {
    let cfg = state.config.load_full();
    let (body, content_type, file) = match format_of(&q)? {
        Format::Yaml => (
            // File syntax: imported again, it loads back the same values.
            switchyard_config::save::file_text(&*cfg, None, &|_| None)
                .map_err(ApiError::internal)?,
            "application/yaml",
            "switchyard-client.yaml",
        ),
        Format::Json => (
            serde_json::to_string_pretty(&*cfg).map_err(|e| ApiError::internal(e.to_string()))?,
            "application/json",
            "switchyard-client.json",
        ),
    };
    let mut r = body.into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{file}\""))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    r.headers_mut()
        .insert(header::CONTENT_DISPOSITION, disposition);
    Ok(r)
}

/// Replaces the configuration with a whole file (YAML or JSON); saved in place of the old one.
#[utoipa::path(post, path = "/api/v1/config/import", tag = "config", params(FormatQuery),
    request_body(content = String, content_type = "application/yaml", description = "a whole client configuration, sent as application/yaml, application/json or application/octet-stream"),
    responses((status = 200, body = ConfigUpdated), (status = 400, body = ConfigValidation),
              (status = 415, description = "a body sent as another type (text/plain, forms: what a web page can send from another site)", body = switchyard_api::ErrorBody)))]
pub async fn import(
    State(state): State<S>,
    Query(q): Query<FormatQuery>,
    TypedBody(body, _): ConfigFileBytes,
) -> Response {
    let format = match format_of(&q) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let parsed = match format {
        // `${NAME}` references would read the client's environment: refused.
        Format::Yaml => std::str::from_utf8(&body)
            .map_err(|e| e.to_string())
            .and_then(|text| match crate::api::config::reference_refusal(text) {
                Some(refusal) => Err(refusal),
                None => ClientConfig::from_yaml_str(text, &|_| None).map_err(|e| e.to_string()),
            }),
        // Through the configuration files' deserializer (JSON is YAML): the binary carries
        // one copy of ClientConfig's path-tracking deserializer (issue 14: binary size).
        Format::Json => serde_json::from_slice::<serde_json::Value>(&body)
            .map_err(|e| e.to_string())
            .and_then(|value| ClientConfig::from_json_value(&value).map_err(|e| e.to_string())),
    };
    match parsed {
        Ok(new) => apply(&state, new, "imported", true).await,
        Err(e) => bad_body(e),
    }
}
