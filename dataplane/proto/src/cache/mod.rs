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
//! * [`policy`]: request and response checks ([`policy::Bypass`] reasons as metric labels),
//!   freshness lifetimes, `Vary` variant keys, the headers an entry keeps, HTTP dates.
//! * [`range`]: `Range` evaluation (RFC 9110 §14), `Content-Range` values, the
//!   `multipart/byteranges` layout and `If-Range`.
//! * [`entry`]: the on-disk entry header (4096-aligned, checksummed, versioned) and the
//!   incremental CRC-32C of bodies.
//! * [`evict`]: the per-tier eviction index (LRU, LFU, FIFO) with byte and entry limits.
//!
//! # Changes to the agreed signatures
//!
//! * [`presets::Preset`] has two more fields, `ignore_query` and `respect_cache_control`: the
//!   rule options a preset fixes (lancache-style keys for all; origin freshness for `linux`,
//!   whose index files change in place). [`presets::names`] lists the names for messages.
//! * [`policy::check_response`] takes the request head instead of its method
//!   (`check_response(request: &RequestHead, response, rule, default_ttl, max_file_size)`): a
//!   response to a request with `Authorization` is stored only when it is explicitly public,
//!   which needs the request's headers. Added: [`policy::wants_fresh_copy`],
//!   [`policy::size_limit`], [`policy::stored_headers`], [`policy::CacheControl`],
//!   [`policy::parse_http_date`] / [`policy::format_http_date`], `Bypass::ALL`;
//!   [`range::boundary`], [`range::MAX_RANGES`], `ByteRange::len`;
//!   [`entry::EntryMeta::header`], [`entry::BLOCK`], [`entry::MAX_HEADER_LEN`];
//!   [`evict::EvictionIndex::evict_one`], `contains`, `size_of`, `is_empty`, `policy`,
//!   `max_bytes`, [`evict::EvictPolicy::name`]. `EvictionIndex::new`'s `max_entries` 0 means
//!   no entry limit; `insert` of an entry that doesn't fit returns that entry as the victim.

pub mod entry;
pub mod evict;
pub mod key;
pub mod policy;
pub mod presets;
pub mod range;
pub mod rules;
