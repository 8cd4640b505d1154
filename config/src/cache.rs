//! `cache:` — the gateway's HTTP cache for plain-HTTP GET responses: storage, built-in presets
//! and custom rules.
//!
//! The spec fixes `enabled` (false), `default_ttl` (30d), `max_file_size` (50GB) and
//! `storage.type` (tiered) and leaves the storage sizes open. The defaults chosen here suit a
//! Raspberry-Pi-class appliance (1–4 GB of RAM, an SD card or USB disk):
//!
//! | key | default | why |
//! |---|---|---|
//! | `storage.memory.max_size` | 256MiB | a quarter of the smallest boards' RAM at most |
//! | `storage.memory.max_entries` | 100000 | bounds index overhead for many tiny objects |
//! | `storage.memory.evict_policy` | lru | the usual choice for download caches |
//! | `storage.disk.path` | `./data/cache` | under the working directory, like other data |
//! | `storage.disk.max_size` | 10GB | fits a 16 GB card or any external disk |
//! | `storage.disk.cleanup_interval` | 1h | expiry sweep cost is small at that rate |
//! | `storage.tiered.memory_threshold` | 1MiB | small objects in RAM, downloads on disk |
//!
//! Rules and presets reload live; a change of `storage`, or turning caching on in a server
//! started with it off, needs a restart ([`CacheConfig::restart_required`]).

use serde::{Deserialize, Serialize};

use crate::units::{Duration, Size};

fn yes() -> bool {
    true
}

fn thirty_days() -> Duration {
    Duration::from_secs(30 * 86_400)
}

fn get_only() -> Vec<String> {
    vec!["GET".into()]
}

/// Methods a rule may list in `methods`: responses to anything else are not cacheable.
pub const CACHEABLE_METHODS: [&str; 2] = ["GET", "HEAD"];

/// `cache:` — see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Turn caching on. Default false.
    pub enabled: bool,
    /// Freshness lifetime of a response under a rule with `respect_cache_control: true` whose
    /// origin gives no `max-age` / `Expires` (capped by the rule's `ttl`). Default 30d.
    pub default_ttl: Duration,
    /// Largest single cached file; larger responses pass through uncached. Default 50GB.
    pub max_file_size: Size,
    /// Where entries are kept.
    #[serde(deserialize_with = "crate::model::null_default")]
    pub storage: CacheStorageConfig,
    /// Built-in preset names to enable (e.g. `steam`, `debian`). Default none.
    #[serde(deserialize_with = "crate::model::null_default")]
    pub presets: Vec<String>,
    /// Custom rules. Default none.
    #[serde(deserialize_with = "crate::model::null_default")]
    pub rules: Vec<CacheRuleConfig>,
}

impl Default for CacheConfig {
    /// Disabled, default_ttl 30d, max_file_size 50GB, tiered storage with the
    /// [module defaults](self), no presets, no rules.
    fn default() -> Self {
        CacheConfig {
            enabled: false,
            default_ttl: thirty_days(),
            max_file_size: Size(50_000_000_000),
            storage: CacheStorageConfig::default(),
            presets: Vec::new(),
            rules: Vec::new(),
        }
    }
}

impl CacheConfig {
    /// Whether going from `self` (running) to `new` needs a restart: a different `storage`, or
    /// caching turned on when the running server has it off. Everything else (rules, presets,
    /// TTLs, `max_file_size`, turning caching off) applies live.
    pub fn restart_required(&self, new: &CacheConfig) -> bool {
        self.storage != new.storage || (!self.enabled && new.enabled)
    }

    /// The rules in force, for [`RuleSet::build`](switchyard_proto::cache::rules::RuleSet):
    /// the custom `rules` in file order, then the enabled `presets` (see
    /// [`effective_rules`](switchyard_proto::cache::rules::effective_rules)).
    pub fn effective_rules(&self) -> Vec<switchyard_proto::cache::rules::CacheRule> {
        switchyard_proto::cache::rules::effective_rules(
            self.rules.iter().map(CacheRuleConfig::to_rule).collect(),
            &self.presets,
        )
    }
}

/// `cache.storage.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageType {
    /// RAM only, bounded by `memory.max_size` and `memory.max_entries`.
    Memory,
    /// Files under `disk.path`, bounded by `disk.max_size`.
    Disk,
    /// Entries at or below `tiered.memory_threshold` in memory, larger ones on disk.
    #[default]
    Tiered,
}

impl StorageType {
    /// The YAML / API value: `memory`, `disk` or `tiered`.
    pub const fn api_name(self) -> &'static str {
        match self {
            StorageType::Memory => "memory",
            StorageType::Disk => "disk",
            StorageType::Tiered => "tiered",
        }
    }

    /// Whether this storage keeps entries in RAM.
    pub const fn uses_memory(self) -> bool {
        matches!(self, StorageType::Memory | StorageType::Tiered)
    }

    /// Whether this storage keeps entries on disk.
    pub const fn uses_disk(self) -> bool {
        matches!(self, StorageType::Disk | StorageType::Tiered)
    }
}

impl std::fmt::Display for StorageType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.api_name())
    }
}

/// `cache.storage.memory.evict_policy`: which entry goes first when the memory tier is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictPolicy {
    /// Least recently used (default).
    #[default]
    Lru,
    /// Least frequently used; ties go to the oldest.
    Lfu,
    /// First in, first out (insertion order; hits don't matter).
    Fifo,
}

impl From<EvictPolicy> for switchyard_proto::cache::evict::EvictPolicy {
    fn from(p: EvictPolicy) -> Self {
        use switchyard_proto::cache::evict::EvictPolicy as P;
        match p {
            EvictPolicy::Lru => P::Lru,
            EvictPolicy::Lfu => P::Lfu,
            EvictPolicy::Fifo => P::Fifo,
        }
    }
}

/// `cache.storage:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheStorageConfig {
    /// `memory`, `disk` or `tiered` (default).
    pub r#type: StorageType,
    #[serde(deserialize_with = "crate::model::null_default")]
    pub memory: MemoryStorageConfig,
    #[serde(deserialize_with = "crate::model::null_default")]
    pub disk: DiskStorageConfig,
    #[serde(deserialize_with = "crate::model::null_default")]
    pub tiered: TieredStorageConfig,
}

/// `cache.storage.memory:` — the RAM tier (type `memory`, and the small entries of `tiered`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryStorageConfig {
    /// Most bytes of bodies held in RAM. Default 256MiB.
    pub max_size: Size,
    /// Most entries held in RAM; 0 = bounded by `max_size` only. Default 100000.
    pub max_entries: u64,
    /// `lru` (default), `lfu` or `fifo`.
    pub evict_policy: EvictPolicy,
}

impl Default for MemoryStorageConfig {
    /// max_size 256MiB, max_entries 100000, lru.
    fn default() -> Self {
        MemoryStorageConfig {
            max_size: Size::mib(256),
            max_entries: 100_000,
            evict_policy: EvictPolicy::Lru,
        }
    }
}

/// `cache.storage.disk:` — the disk tier (type `disk`, and the large entries of `tiered`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskStorageConfig {
    /// Directory of the entry files (created when missing). Default `./data/cache`.
    pub path: String,
    /// Most bytes of entry files on disk. Default 10GB.
    pub max_size: Size,
    /// Period of the sweep that deletes expired entries. Default 1h.
    pub cleanup_interval: Duration,
}

impl Default for DiskStorageConfig {
    /// path `./data/cache`, max_size 10GB, cleanup_interval 1h.
    fn default() -> Self {
        DiskStorageConfig {
            path: "./data/cache".into(),
            max_size: Size(10_000_000_000),
            cleanup_interval: Duration::from_secs(3600),
        }
    }
}

/// `cache.storage.tiered:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TieredStorageConfig {
    /// Entries of at most this many bytes go to memory, larger ones to disk. Default 1MiB.
    pub memory_threshold: Size,
}

impl Default for TieredStorageConfig {
    /// memory_threshold 1MiB.
    fn default() -> Self {
        TieredStorageConfig {
            memory_threshold: Size::mib(1),
        }
    }
}

/// One entry of `cache.rules:` (spec "Cache rule options").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheRuleConfig {
    /// Unique identifier (required).
    #[serde(default)]
    pub name: String,
    /// Domain patterns, same syntax as routes (required, non-empty).
    #[serde(default)]
    pub domains: Vec<String>,
    /// Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long a cached response stays fresh. Default 30d.
    #[serde(default = "thirty_days")]
    pub ttl: Duration,
    /// Higher priority is evaluated first; equal priority → earlier rule first. Default 0.
    #[serde(default)]
    pub priority: i32,
    /// Drop the query string from the cache key. Default false.
    #[serde(default)]
    pub ignore_query: bool,
    /// Cache only these media types: `video/mp4` (exact) or `application/` (prefix, ends with
    /// `/`). Empty (default) = every type.
    #[serde(default)]
    pub content_types: Vec<String>,
    /// Honour origin `Cache-Control`, `Expires`, `Vary`, `Set-Cookie`. Default false
    /// (lancache style: the rule's `ttl` decides).
    #[serde(default)]
    pub respect_cache_control: bool,
    /// Methods cached (`GET`, `HEAD`). Default `[GET]`.
    #[serde(default = "get_only")]
    pub methods: Vec<String>,
    /// Largest cacheable file under this rule; 0 (default) = only `cache.max_file_size`.
    #[serde(default)]
    pub max_size: Size,
}

impl CacheRuleConfig {
    /// A rule with the spec's defaults for everything but `name` and `domains`.
    pub fn new(name: &str, domains: &[&str]) -> Self {
        CacheRuleConfig {
            name: name.into(),
            domains: domains.iter().map(|d| (*d).to_string()).collect(),
            enabled: true,
            ttl: thirty_days(),
            priority: 0,
            ignore_query: false,
            content_types: Vec::new(),
            respect_cache_control: false,
            methods: get_only(),
            max_size: Size::ZERO,
        }
    }

    /// The data plane's form of this rule (`preset: None`).
    pub fn to_rule(&self) -> switchyard_proto::cache::rules::CacheRule {
        switchyard_proto::cache::rules::CacheRule {
            name: self.name.clone(),
            domains: self.domains.clone(),
            enabled: self.enabled,
            ttl: self.ttl.as_std(),
            priority: self.priority,
            ignore_query: self.ignore_query,
            content_types: self.content_types.clone(),
            respect_cache_control: self.respect_cache_control,
            methods: self.methods.clone(),
            max_size: self.max_size.as_u64(),
            preset: None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::ServerConfig;

    fn load(text: &str) -> ServerConfig {
        ServerConfig::from_yaml_str(text, &|_| None).unwrap()
    }

    #[test]
    fn defaults() {
        let c = CacheConfig::default();
        assert!(!c.enabled);
        assert_eq!(c.default_ttl.as_std().as_secs(), 30 * 86_400);
        assert_eq!(c.max_file_size.0, 50_000_000_000);
        assert_eq!(c.storage.r#type, StorageType::Tiered);
        assert_eq!(c.storage.memory.max_size, Size::mib(256));
        assert_eq!(c.storage.memory.max_entries, 100_000);
        assert_eq!(c.storage.memory.evict_policy, EvictPolicy::Lru);
        assert_eq!(c.storage.disk.path, "./data/cache");
        assert_eq!(c.storage.disk.max_size.0, 10_000_000_000);
        assert_eq!(c.storage.disk.cleanup_interval, Duration::from_secs(3600));
        assert_eq!(c.storage.tiered.memory_threshold, Size::mib(1));
        assert_eq!(load("").cache, c);
        assert_eq!(load("cache:\n").cache, c);
        assert_eq!(load("cache: {storage: {memory: }}").cache, c);
    }

    #[test]
    fn rule_defaults() {
        let c = load("cache:\n  rules:\n    - {name: r, domains: [a.com]}\n").cache;
        assert_eq!(c.rules, vec![CacheRuleConfig::new("r", &["a.com"])]);
        let r = &c.rules[0];
        assert!(r.enabled && !r.ignore_query && !r.respect_cache_control);
        assert_eq!(r.ttl, Duration::from_secs(30 * 86_400));
        assert_eq!(r.methods, ["GET"]);
        assert_eq!(r.max_size, Size::ZERO);
    }

    #[test]
    fn full_section_parses_and_round_trips() {
        let c = load(
            r#"
cache:
  enabled: true
  default_ttl: 7d
  max_file_size: 20GiB
  storage:
    type: disk
    memory: {max_size: 1GB, max_entries: 5, evict_policy: lfu}
    disk: {path: /var/cache/sy, max_size: 2TB, cleanup_interval: 10m}
    tiered: {memory_threshold: 4MiB}
  presets: [steam, debian]
  rules:
    - name: iso
      domains: ["*.example.org", "cdn*.example.net"]
      enabled: false
      ttl: 168h
      priority: 5
      ignore_query: true
      content_types: ["application/", "video/mp4"]
      respect_cache_control: true
      methods: [GET, HEAD]
      max_size: 8GiB
"#,
        );
        let cache = &c.cache;
        assert!(cache.enabled);
        assert_eq!(cache.storage.r#type, StorageType::Disk);
        assert_eq!(cache.storage.memory.evict_policy, EvictPolicy::Lfu);
        assert_eq!(cache.storage.disk.path, "/var/cache/sy");
        assert_eq!(cache.presets, ["steam", "debian"]);
        assert_eq!(cache.rules[0].max_size, Size::gib(8));
        assert_eq!(cache.rules[0].methods, ["GET", "HEAD"]);
        let yaml = c.to_yaml_string().unwrap();
        assert!(yaml.contains("type: disk"), "{yaml}");
        assert_eq!(load(&yaml), c);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["cache"]["storage"]["type"], "disk");
        assert_eq!(json["cache"]["rules"][0]["ttl"], "168h0m0s");
        let back: ServerConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn strict_keys_and_values() {
        for bad in [
            "cache: {enabeld: true}",
            "cache: {storage: {type: ssd}}",
            "cache: {storage: {memory: {evict_policy: random}}}",
            "cache: {storage: {disk: {size: 1GB}}}",
            "cache: {rules: [{name: r, domains: [a.com], tll: 1h}]}",
            "cache: {max_file_size: lots}",
        ] {
            assert!(
                ServerConfig::from_yaml_str(bad, &|_| None).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn effective_rules_and_conversion() {
        let c = load(
            "cache: {presets: [linux], rules: [{name: r, domains: [a.com], ttl: 1h, max_size: 1KiB, methods: [GET, HEAD]}]}",
        )
        .cache;
        let rules = c.effective_rules();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].name, "r");
        assert_eq!(rules[0].ttl, std::time::Duration::from_secs(3600));
        assert_eq!(rules[0].max_size, 1024);
        assert_eq!(rules[0].methods, ["GET", "HEAD"]);
        assert_eq!(rules[0].preset, None);
        assert_eq!(rules[1].preset.as_deref(), Some("linux"));
        let set = switchyard_proto::cache::rules::RuleSet::build(rules).unwrap();
        assert_eq!(set.find("A.com").map(|r| r.name.as_str()), Some("r"));
    }

    #[test]
    fn restart_required() {
        let off = CacheConfig::default();
        let mut on = off.clone();
        on.enabled = true;
        assert!(off.restart_required(&on));
        assert!(!on.restart_required(&off));
        let mut rules = on.clone();
        rules.presets.push("steam".into());
        rules.rules.push(CacheRuleConfig::new("r", &["a.com"]));
        rules.default_ttl = Duration::from_secs(60);
        assert!(!on.restart_required(&rules));
        let mut storage = on.clone();
        storage.storage.disk.max_size = Size(1);
        assert!(on.restart_required(&storage));
    }
}
