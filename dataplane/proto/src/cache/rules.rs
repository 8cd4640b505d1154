//! Cache rules and the compiled rule set that picks the rule for a host.
//!
//! A rule says which hosts are cached and how (spec "Cache rule options"). The rule set is
//! compiled once per configuration into a [`RouteTable`], so finding the rule for a request is
//! an indexed lookup with exactly the routing semantics: among the enabled rules with a
//! matching domain pattern, the highest `priority` wins, then the earliest in the list.
//! [`effective_rules`] puts custom rules before presets, so at equal priority a custom rule
//! beats a preset.

use std::time::Duration;

use super::presets::{self, Preset};
use crate::route_matcher::{PatternError, RouteEntry, RouteTable};

/// One cache rule, custom or from a preset, in plain types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRule {
    /// Unique identifier.
    pub name: String,
    /// Domain patterns (route matcher syntax).
    pub domains: Vec<String>,
    /// Disabled rules never match.
    pub enabled: bool,
    /// Freshness lifetime (the upper bound when `respect_cache_control` is on).
    pub ttl: Duration,
    /// Higher is evaluated first.
    pub priority: i32,
    /// Drop the query string from the cache key.
    pub ignore_query: bool,
    /// Media-type filters: `type/subtype` exact or `type/` prefix; empty = every type.
    pub content_types: Vec<String>,
    /// Honour origin and request cache directives (see [`super::policy`]).
    pub respect_cache_control: bool,
    /// Request methods cached (exact, e.g. `GET`).
    pub methods: Vec<String>,
    /// Largest cacheable body in bytes; 0 = unlimited (the global `max_file_size` still applies).
    pub max_size: u64,
    /// The preset this rule comes from, if any.
    pub preset: Option<String>,
}

impl CacheRule {
    /// A rule with the spec's defaults (enabled, ttl 30d, priority 0, `GET` only, no size
    /// limit, no media-type filter, lancache style) for `name` and `domains`.
    pub fn new(name: &str, domains: &[&str]) -> Self {
        CacheRule {
            name: name.to_owned(),
            domains: domains.iter().map(|d| (*d).to_owned()).collect(),
            enabled: true,
            ttl: Duration::from_secs(30 * 86_400),
            priority: 0,
            ignore_query: false,
            content_types: Vec::new(),
            respect_cache_control: false,
            methods: vec!["GET".to_owned()],
            max_size: 0,
            preset: None,
        }
    }

    /// The rule a preset stands for (named like the preset, `preset: Some(name)`).
    pub fn from_preset(p: &Preset) -> Self {
        CacheRule {
            name: p.name.to_owned(),
            domains: p.domains.iter().map(|d| (*d).to_owned()).collect(),
            enabled: true,
            ttl: p.ttl,
            priority: p.priority,
            ignore_query: p.ignore_query,
            content_types: Vec::new(),
            respect_cache_control: p.respect_cache_control,
            methods: vec!["GET".to_owned()],
            max_size: 0,
            preset: Some(p.name.to_owned()),
        }
    }

    /// Whether this rule caches responses to `method` (exact match, methods are
    /// case-sensitive).
    pub fn caches_method(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m == method)
    }
}

/// The rules in force: `custom` rules first, in their order, then the rule of every preset
/// named in `enabled_presets` (in that order; unknown names and repeats are skipped — the
/// configuration validator reports them).
pub fn effective_rules(custom: Vec<CacheRule>, enabled_presets: &[String]) -> Vec<CacheRule> {
    let mut rules = custom;
    for (i, name) in enabled_presets.iter().enumerate() {
        if enabled_presets.iter().take(i).any(|n| n == name) {
            continue;
        }
        if let Some(p) = presets::find(name) {
            rules.push(CacheRule::from_preset(p));
        }
    }
    rules
}

/// A compiled list of rules.
#[derive(Debug, Clone)]
pub struct RuleSet {
    rules: Vec<CacheRule>,
    /// Enabled rules only; values index `rules`.
    table: RouteTable<usize>,
}

impl Default for RuleSet {
    /// No rules: nothing is cached.
    fn default() -> Self {
        RuleSet {
            rules: Vec::new(),
            table: RouteTable::build_lenient(Vec::new()).0,
        }
    }
}

impl RuleSet {
    /// Compiles `rules` (in evaluation order for equal priorities). Any invalid domain
    /// pattern fails the build — of disabled rules too, so enabling one later cannot fail.
    pub fn build(rules: Vec<CacheRule>) -> Result<RuleSet, PatternError> {
        let mut entries = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            if r.enabled {
                entries.push(RouteEntry {
                    patterns: r.domains.clone(),
                    priority: r.priority,
                    value: i,
                });
            } else {
                for d in &r.domains {
                    crate::route_matcher::DomainPattern::parse(d)?;
                }
            }
        }
        let table = RouteTable::build(entries)?;
        Ok(RuleSet { rules, table })
    }

    /// The rule for `host` (no port; case and one trailing dot don't matter): the enabled rule
    /// with a matching pattern and the highest priority, the earliest on ties.
    pub fn find(&self, host: &str) -> Option<&CacheRule> {
        self.table.lookup(host).and_then(|&i| self.rules.get(i))
    }

    /// Every rule, enabled or not, in the order given to [`RuleSet::build`].
    pub fn rules(&self) -> &[CacheRule] {
        &self.rules
    }

    /// Number of rules, enabled or not.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rule(name: &str, domains: &[&str], priority: i32) -> CacheRule {
        CacheRule {
            priority,
            ..CacheRule::new(name, domains)
        }
    }

    fn found(set: &RuleSet, host: &str) -> Option<String> {
        set.find(host).map(|r| r.name.clone())
    }

    #[test]
    fn priority_then_order() {
        let set = RuleSet::build(vec![
            rule("all", &["*"], 0),
            rule("ex", &["*.example.com"], 10),
            rule("ex-same-prio", &["cdn*.example.com"], 10),
            rule("exact-low", &["dl.example.com"], 5),
            rule("top", &["top.example.com"], 100),
        ])
        .unwrap();
        assert_eq!(found(&set, "a.example.com").as_deref(), Some("ex"));
        assert_eq!(found(&set, "cdn1.example.com").as_deref(), Some("ex"));
        assert_eq!(found(&set, "dl.example.com").as_deref(), Some("ex"));
        assert_eq!(found(&set, "TOP.example.com.").as_deref(), Some("top"));
        assert_eq!(found(&set, "example.com").as_deref(), Some("all"));
        assert_eq!(found(&set, "other.org").as_deref(), Some("all"));
        assert_eq!(set.len(), 5);
        assert_eq!(set.rules()[1].name, "ex");
    }

    #[test]
    fn disabled_rules_never_match() {
        let mut off = rule("off", &["*.example.com"], 50);
        off.enabled = false;
        let set = RuleSet::build(vec![off, rule("on", &["a.example.com"], 0)]).unwrap();
        assert_eq!(found(&set, "a.example.com").as_deref(), Some("on"));
        assert_eq!(found(&set, "b.example.com"), None);
        assert_eq!(set.len(), 2);
        assert!(!set.is_empty());
    }

    #[test]
    fn invalid_patterns_fail_the_build() {
        assert!(RuleSet::build(vec![rule("bad", &["a b.com"], 0)]).is_err());
        let mut off = rule("bad-off", &[".x.com"], 0);
        off.enabled = false;
        assert!(RuleSet::build(vec![off]).is_err());
        let empty = RuleSet::default();
        assert!(empty.is_empty());
        assert_eq!(empty.find("anything"), None);
    }

    #[test]
    fn presets_become_rules_after_custom_ones() {
        let custom = vec![rule("mine", &["deb.debian.org"], 0)];
        let rules = effective_rules(
            custom,
            &[
                "linux".to_owned(),
                "nope".to_owned(),
                "steam".to_owned(),
                "linux".to_owned(),
            ],
        );
        let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["mine", "linux", "steam"]);
        assert_eq!(rules[0].preset, None);
        assert_eq!(rules[1].preset.as_deref(), Some("linux"));
        assert!(rules[1].respect_cache_control && rules[1].ignore_query);
        let steam = presets::find("steam").unwrap();
        assert_eq!(rules[2].ttl, steam.ttl);
        assert_eq!(rules[2].domains.len(), steam.domains.len());

        let set = RuleSet::build(rules).unwrap();
        // equal priority: the custom rule wins over the preset
        assert_eq!(found(&set, "deb.debian.org").as_deref(), Some("mine"));
        assert_eq!(found(&set, "ftp.de.debian.org").as_deref(), Some("linux"));
        assert_eq!(
            found(&set, "cache1-fra1.steamcontent.com").as_deref(),
            Some("steam")
        );
        assert_eq!(found(&set, "example.org"), None);
    }

    #[test]
    fn every_preset_compiles() {
        let all: Vec<String> = presets::names().map(str::to_owned).collect();
        let set = RuleSet::build(effective_rules(Vec::new(), &all)).unwrap();
        assert_eq!(set.len(), 13);
        for p in presets::all() {
            assert!(set.rules().iter().any(|r| r.name == p.name));
        }
    }

    #[test]
    fn methods_are_exact() {
        let r = CacheRule::new("r", &["x"]);
        assert!(r.caches_method("GET"));
        assert!(!r.caches_method("get"));
        assert!(!r.caches_method("HEAD"));
    }
}
