//! The configuration lifecycle of a running server: API changes to backends and routes, saving
//! a new configuration to disk (atomically, with an optional backup), reloading from disk, and
//! applying hot-reloadable sections by publishing a new data-plane snapshot. Every change goes
//! through [`ServerState::config_write`], so changes never interleave and the file is never torn.

use crate::server::ServerState;
use chrono::Utc;
use serde_json::json;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_api::{ConfigSaveResult, FieldError};
use switchyard_config::{Problem, ServerConfig, HOT_RELOADABLE_SECTIONS};
use switchyard_dataplane::Snapshot;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the server runs on built-in defaults: there is no configuration file to {0}")]
    NoFile(&'static str),
    #[error("{0}")]
    Load(String),
    #[error("invalid configuration ({} problems)", .0.len())]
    Invalid(Vec<Problem>),
    #[error("applying the configuration failed: {0}")]
    Apply(String),
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub struct ReloadOutcome {
    pub changed_sections: Vec<&'static str>,
    pub restart_required: Vec<&'static str>,
}

/// Publishes `cfg` as the running configuration: compiles a snapshot (counters and health carry
/// over by backend name) and swaps it in. New connections and requests use it at once.
/// Provider backends enter the snapshot as the backends they resolved to.
pub fn apply(state: &ServerState, cfg: ServerConfig) -> Result<(), ConfigError> {
    publish(state, &cfg)?;
    state.request_log.set_capacity(cfg.api.request_log_size);
    state.config.store(Arc::new(cfg));
    // New or changed provider backends resolve in the background.
    state.providers.wake();
    Ok(())
}

/// Compiles the running configuration again (provider resolutions changed).
pub async fn republish(state: &ServerState) -> Result<(), ConfigError> {
    let _guard = state.config_write.lock().await;
    let cfg = state.config.load_full();
    publish(state, &cfg)
}

/// Compiles the snapshot of `cfg` (provider backends as what they resolved to, counters and
/// health carried over from the running one), tells the OpenVPN supervisor about the effective
/// backends (provider backends resolved to openvpn included) and swaps the snapshot in.
fn publish(state: &ServerState, cfg: &ServerConfig) -> Result<(), ConfigError> {
    let previous = state.snapshot.load_full();
    let effective = state.providers.effective(cfg);
    let snapshot = Snapshot::compile(&effective, Some(&previous), state.cores)
        .map_err(|e| ConfigError::Apply(e.to_string()))?;
    state.openvpn.reconcile(&effective, &snapshot);
    state.snapshot.store(Arc::new(snapshot));
    Ok(())
}

/// The running configuration with the hot-reloadable sections taken from `new`.
fn with_hot_sections(running: &ServerConfig, new: &ServerConfig) -> ServerConfig {
    let mut effective = running.clone();
    effective.routes = new.routes.clone();
    effective.rate_limit = new.rate_limit.clone();
    effective.access_control = new.access_control.clone();
    // Cache rules and presets reload; storage and turning caching on wait for a restart.
    effective.cache.rules = new.cache.rules.clone();
    effective.cache.presets = new.cache.presets.clone();
    effective.cache.default_ttl = new.cache.default_ttl;
    effective.cache.max_file_size = new.cache.max_file_size;
    effective
}

/// (applied now, needing a restart). `cache` can be both: its rules reload, its storage not.
fn split_sections(
    changed: &[&'static str],
    running: &ServerConfig,
    new: &ServerConfig,
) -> (Vec<&'static str>, Vec<&'static str>) {
    let (hot, mut restart): (Vec<&'static str>, Vec<&'static str>) = changed
        .iter()
        .partition(|s| HOT_RELOADABLE_SECTIONS.contains(s));
    if hot.contains(&"cache") && running.cache.restart_required(&new.cache) {
        restart.push("cache");
    }
    (hot, restart)
}

/// Re-reads the file and applies its hot-reloadable sections.
pub async fn reload(state: &ServerState) -> Result<ReloadOutcome, ConfigError> {
    let _guard = state.config_write.lock().await;
    let path = state
        .config_path
        .as_ref()
        .ok_or(ConfigError::NoFile("reload"))?;
    let new = ServerConfig::load_file(path).map_err(|e| ConfigError::Load(e.to_string()))?;
    let problems = crate::config_checks::validate(&new);
    if !problems.is_empty() {
        return Err(ConfigError::Invalid(problems));
    }
    let running = state.config.load_full();
    let changed = switchyard_config::changed_sections(&running, &new);
    let (_hot, restart_required) = split_sections(&changed, &running, &new);
    apply(state, with_hot_sections(&running, &new))?;
    state.count_reload();
    state.hub.publish(
        "config.reload",
        json!({"changed_sections": changed, "requires_restart": !restart_required.is_empty()}),
    );
    Ok(ReloadOutcome {
        changed_sections: changed,
        restart_required,
    })
}

/// Changes the running configuration through `change`, validates the result as a whole and
/// applies it. Nothing is written to disk (`PUT /api/v1/config` does that).
pub async fn mutate<T, E>(
    state: &ServerState,
    change: impl FnOnce(&mut ServerConfig) -> Result<T, E>,
) -> Result<T, MutateError<E>> {
    let _guard = state.config_write.lock().await;
    let mut cfg = (*state.config.load_full()).clone();
    let out = change(&mut cfg).map_err(MutateError::Refused)?;
    let problems = crate::config_checks::validate(&cfg);
    if !problems.is_empty() {
        return Err(MutateError::Invalid(problems));
    }
    apply(state, cfg).map_err(MutateError::Apply)?;
    Ok(out)
}

#[derive(Debug)]
pub enum MutateError<E> {
    /// The change itself refused (not found, exists, …).
    Refused(E),
    /// The resulting configuration is invalid.
    Invalid(Vec<Problem>),
    Apply(ConfigError),
}

/// Writes `text` to `path` atomically: a temporary file in the same directory (same mode as the
/// file it replaces), fsynced, renamed over the old one, and the directory fsynced.
pub fn write_atomically(path: &Path, text: &str) -> Result<(), ConfigError> {
    let io = |source| ConfigError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mode = std::fs::metadata(path).ok().map(|m| m.permissions());
    let mut tmp = tempfile::Builder::new()
        .prefix(".switchyard-config-")
        .tempfile_in(dir)
        .map_err(io)?;
    tmp.write_all(text.as_bytes()).map_err(io)?;
    if let Some(mode) = mode {
        tmp.as_file().set_permissions(mode).map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}

/// Copies the current file to `<file>.<UTC timestamp>.bak` and returns that path.
fn backup(path: &Path) -> Result<PathBuf, ConfigError> {
    let stamp = Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    let target = PathBuf::from(format!("{}.{stamp}.bak", path.display()));
    std::fs::copy(path, &target).map_err(|source| ConfigError::Io {
        path: target.clone(),
        source,
    })?;
    Ok(target)
}

fn strings(v: &[&'static str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// `PUT /api/v1/config`: validates, writes, applies the hot sections. `Err` carries validation
/// problems (nothing written) or a write failure.
pub async fn save(
    state: &ServerState,
    new: ServerConfig,
    create_backup: bool,
) -> Result<ConfigSaveResult, ConfigError> {
    let problems = crate::config_checks::validate(&new);
    if !problems.is_empty() {
        return Err(ConfigError::Invalid(problems));
    }
    let _guard = state.config_write.lock().await;
    let path = state
        .config_path
        .as_ref()
        .ok_or(ConfigError::NoFile("save to"))?;
    // The file's `${NAME}` references stay as written (its backup too); other values are
    // written so that loading never expands them.
    let previous = std::fs::read_to_string(path).ok();
    let text = switchyard_config::save::file_text(&new, previous.as_deref(), &|name| {
        std::env::var(name).ok()
    })
    .map_err(ConfigError::Apply)?;
    let backup_path = if create_backup && path.exists() {
        Some(backup(path)?)
    } else {
        None
    };
    write_atomically(path, &text)?;
    tracing::info!(file = %path.display(), backup = ?backup_path, "configuration saved");

    let running = state.config.load_full();
    let changed = switchyard_config::changed_sections(&running, &new);
    let (hot, restart) = split_sections(&changed, &running, &new);
    let mut result = ConfigSaveResult {
        success: true,
        message: "configuration saved".into(),
        changed_sections: strings(&changed),
        hot_reloaded_sections: Vec::new(),
        restart_required_sections: strings(&restart),
        requires_restart: false,
        backup_path: backup_path.map(|p| p.display().to_string()),
        errors: Vec::new(),
    };
    if !hot.is_empty() {
        match apply(state, with_hot_sections(&running, &new)) {
            Ok(()) => {
                state.count_reload();
                result.hot_reloaded_sections = strings(&hot);
            }
            Err(e) => {
                // The save stands; nothing was applied, so every change waits for a restart.
                tracing::error!(error = %e, "saved configuration could not be applied");
                result.message =
                    "configuration saved, but applying it failed; restart to apply".into();
                result.restart_required_sections = strings(&changed);
                result.errors.push(FieldError {
                    section: "reload".into(),
                    field: String::new(),
                    message: e.to_string(),
                });
            }
        }
    }
    result.requires_restart = !result.restart_required_sections.is_empty();
    state.hub.publish(
        "config.saved",
        json!({
            "changed_sections": result.changed_sections,
            "hot_reloaded_sections": result.hot_reloaded_sections,
            "restart_required_sections": result.restart_required_sections,
            "requires_restart": result.requires_restart,
        }),
    );
    Ok(result)
}

/// The configuration as JSON with passwords, keys and tokens masked
/// ([`switchyard_config::secrets::mask_server`]).
pub fn sanitized(cfg: &ServerConfig) -> serde_json::Value {
    let mut v = cfg.to_json_value().unwrap_or_default();
    switchyard_config::secrets::mask_server(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_openvpn_key_material() {
        let cfg = ServerConfig::from_yaml_str(
            "backends:\n  - {name: v, type: openvpn, openvpn: {remote: h, ca: /ca.pem, cert: /c.pem, \
             key: \"-----BEGIN PRIVATE KEY-----\\nx\\n-----END PRIVATE KEY-----\", tls_crypt: /t.key, \
             username: u, password: pw}}\nroutes: []\n",
            &|_| None,
        )
        .expect("config");
        let v = sanitized(&cfg);
        let o = &v["backends"][0]["openvpn"];
        assert_eq!(o["key"], "********", "{o}");
        assert_eq!(o["tls_crypt"], "********", "{o}");
        assert_eq!(o["password"], "********", "{o}");
        assert_eq!(o["cert"], "/c.pem", "{o}");
        assert_eq!(o["username"], "u", "{o}");
    }

    #[test]
    fn atomic_write_keeps_mode_and_replaces() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "old").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        write_atomically(&path, "new").expect("atomic write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        let b = backup(&path).expect("backup");
        assert_eq!(std::fs::read_to_string(b).expect("read"), "new");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".switchyard-config-")
            })
            .collect();
        assert!(leftovers.is_empty());
    }
}
