//! Configuration model for `switchyard server` and the other commands ([`client`] for
//! `switchyard client`).
//!
//! # Loading
//!
//! [`ServerConfig::load_file`] / [`ServerConfig::from_yaml_str`]:
//!
//! 1. **Environment expansion** of the raw text ([`env`](mod@env)): `${NAME}` is replaced by the
//!    variable's value; an unset variable is an error naming it; `${NAME:-fallback}` gives a
//!    fallback; `$$` is a literal `$`; other `$` are kept (bcrypt hashes need no escaping);
//!    comments are not expanded.
//! 2. **Strict YAML** (via `serde-saphyr`): unknown keys, duplicate keys, wrong types, unknown
//!    backend types and bad durations/sizes are a [`LoadError::Parse`] naming the key path
//!    (`server.http.lisen`, `backends[2].type`) with line and column.
//! 3. **Defaults** for every missing key (see the `Default` impls in [`model`]). A file with
//!    neither `backends` nor `routes` gets a `direct` backend and a catch-all `default` route.
//!
//! Then [`validate()`] reports every semantic problem (dangling references, duplicates, bad
//! addresses and patterns, unimplemented features) as a list of [`Problem`]s.
//!
//! # Serialization
//!
//! The model serializes with the same key names it is read with, to YAML
//! ([`ServerConfig::to_yaml_string`]) or JSON (`serde_json::to_value`), and reads back to an
//! equal value: durations print Go-style (`1m30s`, `720h0m0s`), sizes as `64KiB` / `2GB` or
//! an exact byte count, access-control entries as CIDRs. See [`units`].
//!
//! # Other helpers
//!
//! - [`parse_listen`] / [`ListenAddr`]: listen address syntax and bind addresses.
//! - [`AllowedOrigins`] / [`OriginPattern`]: the parsed `api.allowed_origins` entries.
//! - [`changed_sections`] / [`is_hot_reloadable`]: what a config change touches;
//!   [`CacheConfig::restart_required`] tells which `cache` changes need a restart.
//! - [`cache`]: the `cache:` section (storage, presets, rules) and its defaults.
//! - [`wireguard`]: the typed settings object of `wireguard` backends.
//! - [`provider`]: the typed `config` object of provider backends (`nordvpn`, `mullvad`, …).
//! - [`health_check`]: backends' active health checks (`server.health_check` defaults, the
//!   per-backend `health_check` object) resolved to a [`health_check::HealthCheckPlan`].
//! - [`openvpn`]: the typed settings object of `openvpn` backends; [`openvpn_options`]: the
//!   allow-list of OpenVPN options for its `extra` lines and `config_file`.
//! - [`BackendType::api_name`] / [`BackendType::is_available`], [`AuthMode::is_available`].
//! - [`secrets`]: which keys `GET /api/v1/config` masks and how masked values sent back get
//!   their secrets again; [`save`]: the text a configuration is saved as (keeps `${NAME}`
//!   references, never lets an API value expand).
//!
//! No I/O beyond reading the file.
#![forbid(unsafe_code)]

pub mod cache;
pub mod client;
pub mod env;
pub mod health_check;
pub mod inventory;
mod key_path;
pub mod listen;
pub mod load;
pub mod mesh_registry;
pub mod model;
pub mod openvpn;
pub mod openvpn_options;
pub mod origin;
pub mod pkgcache;
pub mod provider;
pub mod save;
pub mod secrets;
pub mod sections;
pub mod settings_error;
pub mod subtitles;
pub mod units;
pub mod validate;
pub mod wireguard;

pub use cache::{
    CacheConfig, CacheRuleConfig, CacheStorageConfig, DiskStorageConfig, EvictPolicy,
    MemoryStorageConfig, StorageType, TieredStorageConfig,
};
pub use listen::{parse_listen, ListenAddr, ListenAddrError};
pub use load::{JsonValueError, LoadError, SerializeError};
pub use mesh_registry::{MeshRegistryConfig, MeshSection};
pub use model::*;
pub use origin::{AllowedOrigins, OriginPattern, OriginPatternError};
pub use sections::{
    changed_sections, is_hot_reloadable, section_metadata, SectionInfo, HOT_RELOADABLE_SECTIONS,
    SECTIONS,
};
pub use units::{Duration, Size, UnitError};
pub use validate::{validate, validate_cache, Problem};
