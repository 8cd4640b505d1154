//! `/api/v1/config*` and `/api/v1/auth/plugins`: the configuration lifecycle over HTTP. The
//! `/api/v1/config/yaml` endpoints (not in the spec) do the same with the file's own format, for
//! the dashboard's YAML editor: read, validate and save go through the JSON endpoints' steps.

use super::error::{ApiError, ApiJson};
use crate::config_store::{self, ConfigError};
use crate::server::ServerState;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use std::sync::Arc;
use switchyard_api::{
    AuthPlugin, AuthPluginList, ConfigSaveRequest, ConfigSaveResult, ConfigSectionMeta,
    MessageWithTime, PluginAvailability, ValidationError, ValidationResult,
};
use switchyard_config::{AuthMode, Problem, ServerConfig};

/// The sections `GET /api/v1/config/meta` describes, in the spec's order.
const META_SECTIONS: [&str; 7] = [
    "routes",
    "rate_limit",
    "server",
    "backends",
    "access_control",
    "cache",
    "auth",
];

#[utoipa::path(get, path = "/api/v1/config", tag = "config",
    responses((status = 200, description = "running configuration, secrets masked", body = Object)))]
pub async fn get_sanitized(State(state): State<Arc<ServerState>>) -> Json<serde_json::Value> {
    Json(config_store::sanitized(&state.config.load()))
}

#[utoipa::path(get, path = "/api/v1/config/full", tag = "config",
    responses((status = 200, description = "running configuration including secrets", body = Object)))]
pub async fn get_full(State(state): State<Arc<ServerState>>) -> Json<serde_json::Value> {
    Json(state.config.load().to_json_value().unwrap_or_default())
}

#[utoipa::path(get, path = "/api/v1/config/meta", tag = "config", responses((status = 200, body = [ConfigSectionMeta])))]
pub async fn meta() -> Json<Vec<ConfigSectionMeta>> {
    let known = switchyard_config::section_metadata();
    Json(
        META_SECTIONS
            .iter()
            .map(|s| ConfigSectionMeta {
                section: (*s).into(),
                hot_reloadable: switchyard_config::is_hot_reloadable(s),
                description: known.iter().find(|k| k.section == *s).map_or_else(
                    || {
                        "HTTP cache: rules and presets reload live; storage changes need a restart"
                            .into()
                    },
                    |k| k.description.into(),
                ),
            })
            .collect(),
    )
}

fn validation(problems: &[Problem], message: Option<String>) -> ValidationResult {
    ValidationResult {
        valid: problems.is_empty() && message.is_none(),
        errors: problems
            .iter()
            .map(|p| ValidationError {
                section: p.section.clone(),
                message: format!("{}: {}", p.field, p.message),
            })
            .collect(),
        warnings: Vec::new(),
        message,
    }
}

/// Parses a posted configuration object; a structural error is reported like a validation
/// problem naming the offending key.
fn parse(value: serde_json::Value) -> Result<ServerConfig, ValidationResult> {
    ServerConfig::from_json_value(&value).map_err(|e| {
        let section = e
            .path
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_owned();
        ValidationResult {
            valid: false,
            errors: vec![ValidationError {
                section,
                message: e.to_string(),
            }],
            warnings: Vec::new(),
            message: Some("the configuration does not have the expected structure".into()),
        }
    })
}

/// Warnings for providers this build can parse but not run.
fn warnings(cfg: &ServerConfig) -> Vec<String> {
    cfg.backends
        .iter()
        .filter(|b| b.enabled && !b.kind.is_available())
        .map(|b| {
            format!(
                "backend {} of type {} is not available in this build yet",
                b.name,
                b.kind.api_name()
            )
        })
        .collect()
}

#[utoipa::path(post, path = "/api/v1/config/validate", tag = "config", request_body(content = Object),
    responses((status = 200, body = ValidationResult)))]
pub async fn validate(ApiJson(value): ApiJson<serde_json::Value>) -> Json<ValidationResult> {
    Json(validate_value(value))
}

fn validate_value(value: serde_json::Value) -> ValidationResult {
    match parse(value) {
        Ok(cfg) => {
            let problems = crate::config_checks::validate(&cfg);
            let message = (!problems.is_empty()).then(|| format!("{} problems", problems.len()));
            let mut result = validation(&problems, message);
            result.warnings = warnings(&cfg);
            result
        }
        Err(invalid) => invalid,
    }
}

#[utoipa::path(put, path = "/api/v1/config", tag = "config", request_body = ConfigSaveRequest,
    responses((status = 200, body = ConfigSaveResult),
              (status = 400, description = "invalid configuration, nothing written", body = ValidationResult),
              (status = 409, description = "no configuration file (running on defaults)", body = switchyard_api::ErrorBody)))]
pub async fn save(
    State(state): State<Arc<ServerState>>,
    ApiJson(body): ApiJson<ConfigSaveRequest>,
) -> Response {
    save_value(&state, body.config, body.create_backup).await
}

/// Saves a posted configuration object (secrets still masked are the running ones).
async fn save_value(state: &ServerState, mut posted: serde_json::Value, backup: bool) -> Response {
    let running = state.config.load().to_json_value().unwrap_or_default();
    switchyard_config::secrets::unmask(&mut posted, &running);
    let cfg = match parse(posted) {
        Ok(c) => c,
        Err(invalid) => return (StatusCode::BAD_REQUEST, Json(invalid)).into_response(),
    };
    match config_store::save(state, cfg, backup).await {
        Ok(result) => Json(result).into_response(),
        Err(ConfigError::Invalid(problems)) => {
            let msg = format!("{} problems; nothing was written", problems.len());
            (
                StatusCode::BAD_REQUEST,
                Json(validation(&problems, Some(msg))),
            )
                .into_response()
        }
        Err(e @ ConfigError::NoFile(_)) => {
            ApiError::conflict("NO_CONFIG_FILE", e.to_string()).into_response()
        }
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

/// Why configuration text sent through the API is refused: a `${NAME}` reference, which would
/// read the server's environment (any token holder could read any variable).
pub(crate) fn reference_refusal(text: &str) -> Option<String> {
    switchyard_config::save::first_reference(text).map(|(name, line)| {
        format!(
            "line {line}: `${{{name}}}` is not expanded in a configuration sent through the API \
             (it would read the server's environment): write the value itself, `$${{{name}}}` \
             for the literal text, or edit the file for a reference"
        )
    })
}

/// A YAML configuration as the JSON value the JSON endpoints take; unreadable YAML (syntax,
/// unknown keys, wrong types) is a validation result naming the problem.
fn yaml_value(body: &[u8]) -> Result<serde_json::Value, ValidationResult> {
    let invalid = |message: String| ValidationResult {
        valid: false,
        errors: vec![ValidationError {
            section: "yaml".into(),
            message: message.clone(),
        }],
        warnings: Vec::new(),
        message: Some(message),
    };
    let text = std::str::from_utf8(body).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    if let Some(message) = reference_refusal(text) {
        return Err(invalid(message));
    }
    let cfg = ServerConfig::from_yaml_str(text, &|_| None).map_err(|e| invalid(e.to_string()))?;
    cfg.to_json_value().map_err(|e| invalid(e.to_string()))
}

/// The running configuration (secrets included) as YAML, as a configuration file holds it.
#[utoipa::path(get, path = "/api/v1/config/yaml", tag = "config",
    responses((status = 200, description = "running configuration including secrets, YAML (not in the spec)", content_type = "application/yaml", body = String)))]
pub async fn get_yaml(State(state): State<Arc<ServerState>>) -> Result<Response, ApiError> {
    // In file syntax: a `$` that loading would read as a reference is doubled.
    let yaml = switchyard_config::save::file_text(&**state.config.load(), None, &|_| None)
        .map_err(ApiError::internal)?;
    let mut r = yaml.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/yaml; charset=utf-8"),
    );
    Ok(r)
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
pub struct BackupQuery {
    /// Keep a backup of the file before writing (as `create_backup` of `PUT /api/v1/config`).
    #[serde(default)]
    create_backup: bool,
}

/// `POST /api/v1/config/validate` for a YAML configuration (not in the spec).
#[utoipa::path(post, path = "/api/v1/config/yaml/validate", tag = "config",
    request_body(content = String, content_type = "application/yaml", description = "a whole server configuration"),
    responses((status = 200, body = ValidationResult),
              (status = 415, description = "a body not sent as application/yaml, application/json or application/octet-stream", body = switchyard_api::ErrorBody)))]
pub async fn validate_yaml(
    super::body::TypedBody(body, _): super::body::ConfigFileBytes,
) -> Json<ValidationResult> {
    Json(yaml_value(&body).map_or_else(|invalid| invalid, validate_value))
}

/// `PUT /api/v1/config` for a YAML configuration (not in the spec): the same save result.
#[utoipa::path(put, path = "/api/v1/config/yaml", tag = "config", params(BackupQuery),
    request_body(content = String, content_type = "application/yaml", description = "a whole server configuration"),
    responses((status = 200, body = ConfigSaveResult),
              (status = 400, description = "invalid configuration, nothing written", body = ValidationResult),
              (status = 409, description = "no configuration file (running on defaults)", body = switchyard_api::ErrorBody),
              (status = 415, description = "a body not sent as application/yaml, application/json or application/octet-stream", body = switchyard_api::ErrorBody)))]
pub async fn save_yaml(
    State(state): State<Arc<ServerState>>,
    Query(q): Query<BackupQuery>,
    super::body::TypedBody(body, _): super::body::ConfigFileBytes,
) -> Response {
    match yaml_value(&body) {
        Ok(value) => save_value(&state, value, q.create_backup).await,
        Err(invalid) => (StatusCode::BAD_REQUEST, Json(invalid)).into_response(),
    }
}

#[utoipa::path(post, path = "/api/v1/config/reload", tag = "config",
    responses((status = 200, body = MessageWithTime), (status = 400, body = switchyard_api::ErrorBody),
              (status = 409, body = switchyard_api::ErrorBody)))]
pub async fn reload(
    State(state): State<Arc<ServerState>>,
) -> Result<Json<MessageWithTime>, ApiError> {
    match config_store::reload(&state).await {
        Ok(o) => {
            let mut message = format!(
                "configuration reloaded; changed sections: [{}]",
                o.changed_sections.join(", ")
            );
            if !o.restart_required.is_empty() {
                message.push_str(&format!(
                    "; restart required for [{}]",
                    o.restart_required.join(", ")
                ));
            }
            tracing::info!(changed = ?o.changed_sections, "configuration reloaded (API)");
            Ok(Json(MessageWithTime {
                message,
                time: Utc::now(),
            }))
        }
        Err(e @ ConfigError::NoFile(_)) => Err(ApiError::conflict("NO_CONFIG_FILE", e.to_string())),
        Err(ConfigError::Invalid(problems)) => Err(super::backends::problems_to_error(
            &problems,
            "INVALID_CONFIG",
        )),
        Err(e @ ConfigError::Load(_)) => {
            Err(ApiError::bad_request("INVALID_CONFIG", e.to_string()))
        }
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

#[utoipa::path(get, path = "/api/v1/auth/plugins", tag = "config", responses((status = 200, body = AuthPluginList)))]
pub async fn auth_plugins() -> Json<AuthPluginList> {
    let describe = |mode: AuthMode| match mode {
        AuthMode::None => "no proxy authentication",
        AuthMode::Native => {
            "users with bcrypt password hashes in the configuration (auth.native.users)"
        }
        AuthMode::System => "operating-system accounts through PAM (auth.system.service)",
        AuthMode::Ldap => "LDAP bind against a directory (auth.ldap)",
        AuthMode::Oauth => "OAuth 2 / OpenID Connect tokens (auth.oauth)",
    };
    let plugins = AuthMode::ALL
        .iter()
        .filter(|m| **m != AuthMode::None)
        .map(|&m| AuthPlugin {
            name: m.api_name().into(),
            kind: m.api_name().into(),
            description: describe(m).into(),
            availability: {
                let a = switchyard_proxy_auth::availability(m);
                PluginAvailability {
                    state: a.state().into(),
                    reason: a.reason().map(Into::into),
                }
            },
        })
        .collect();
    Json(AuthPluginList { plugins })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn structural_errors_name_the_key() {
        let err = parse(json!({"server": {"http": {"lisen": ":1"}}})).expect_err("error");
        assert!(!err.valid);
        assert_eq!(err.errors[0].section, "server");
        assert!(err.errors[0].message.contains("lisen"), "{:?}", err.errors);
    }
}
