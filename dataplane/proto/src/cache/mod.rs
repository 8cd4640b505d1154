//! Runtime-free core of the gateway's HTTP cache (issue 5): which requests and responses are
//! cacheable and for how long, the cache key, ranges, the on-disk entry format and the
//! eviction index. The data-plane store (memory / disk / tiered, coalescing) and the control
//! plane call these; nothing here does I/O or reads a clock.
//!
//! * [`presets`]: the thirteen built-in presets (game stores, consoles, OS updates, app stores,
//!   Linux repositories).
//! * [`key`]: the canonical cache key (`http://host[:port]/path?query`) and the stable
//!   128-bit file-name stem derived from it.
//! * [`rules`]: [`rules::CacheRule`], the compiled [`rules::RuleSet`] (routing semantics:
//!   priority, then order) and [`rules::effective_rules`] (custom rules, then presets).
//!
//! # Changes to the agreed signatures
//!
//! * [`presets::Preset`] has two more fields, `ignore_query` and `respect_cache_control`: the
//!   rule options a preset fixes (lancache-style keys for all; origin freshness for `linux`,
//!   whose index files change in place). [`presets::names`] lists the names for messages.

pub mod key;
pub mod presets;
pub mod rules;
