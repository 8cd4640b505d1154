//! Top-level sections: which changed between two configs, and which apply without a restart.

use serde::Serialize;

use crate::model::ServerConfig;

/// The top-level sections of [`ServerConfig`], in file order.
pub const SECTIONS: [&str; 11] = [
    "server",
    "backends",
    "routes",
    "auth",
    "access_control",
    "rate_limit",
    "api",
    "logging",
    "metrics",
    "cache",
    "mesh",
];

/// Sections a running server applies without a restart. For `cache` that means rules,
/// presets and TTLs; a storage change or turning caching on needs a restart, see
/// [`crate::CacheConfig::restart_required`].
pub const HOT_RELOADABLE_SECTIONS: [&str; 4] = ["routes", "rate_limit", "access_control", "cache"];

/// Whether changes to `section` apply without a restart: exactly `routes`, `rate_limit`
/// (including bandwidth), `access_control` and `cache`.
pub fn is_hot_reloadable(section: &str) -> bool {
    HOT_RELOADABLE_SECTIONS.contains(&section)
}

/// The top-level sections whose contents differ, in [`SECTIONS`] order.
pub fn changed_sections(old: &ServerConfig, new: &ServerConfig) -> Vec<&'static str> {
    let diffs = [
        old.server != new.server,
        old.backends != new.backends,
        old.routes != new.routes,
        old.auth != new.auth,
        old.access_control != new.access_control,
        old.rate_limit != new.rate_limit,
        old.api != new.api,
        old.logging != new.logging,
        old.metrics != new.metrics,
        old.cache != new.cache,
        old.mesh != new.mesh,
    ];
    SECTIONS
        .iter()
        .zip(diffs)
        .filter_map(|(s, changed)| changed.then_some(*s))
        .collect()
}

/// A "config section metadata" entry of the management API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SectionInfo {
    pub section: &'static str,
    pub hot_reloadable: bool,
    pub description: &'static str,
}

/// Metadata for every section of [`SECTIONS`].
pub fn section_metadata() -> Vec<SectionInfo> {
    SECTIONS
        .iter()
        .map(|&section| SectionInfo {
            section,
            hot_reloadable: is_hot_reloadable(section),
            description: match section {
                "server" => {
                    "proxy listeners (HTTP, SOCKS5), timeouts, PAC, cores, connection limit"
                }
                "backends" => "upstream backends traffic is forwarded through",
                "routes" => "domain patterns mapped to backends, with priority",
                "auth" => "proxy authentication of clients",
                "access_control" => "client IP whitelist and blacklist",
                "rate_limit" => "request rate and bandwidth limits",
                "api" => "management API listener, token, origins, request log",
                "logging" => "log level, format and output",
                "metrics" => "metrics listener",
                "cache" => {
                    "HTTP cache: rules and presets reload live; storage changes and turning caching on need a restart"
                }
                "mesh" => "mesh registry: networks, peers and leases store, lease time",
                _ => "",
            },
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hot_reloadable_set() {
        for s in ["routes", "rate_limit", "access_control", "cache"] {
            assert!(is_hot_reloadable(s));
        }
        for s in [
            "server", "backends", "auth", "api", "logging", "metrics", "bogus",
        ] {
            assert!(!is_hot_reloadable(s));
        }
    }

    #[test]
    fn changed() {
        let a = ServerConfig::default();
        assert!(changed_sections(&a, &a.clone()).is_empty());
        let mut b = a.clone();
        b.rate_limit.enabled = true;
        b.server.http.listen = ":1".into();
        b.metrics.enabled = true;
        b.routes[0].priority = 5;
        assert_eq!(
            changed_sections(&a, &b),
            ["server", "routes", "rate_limit", "metrics"]
        );
        let mut c = a.clone();
        c.backends.clear();
        c.auth.native.users.push(crate::model::NativeUser {
            username: "u".into(),
            password_hash: String::new(),
        });
        c.access_control
            .blacklist
            .push("10.0.0.0/8".parse().unwrap());
        c.api.enable_request_log = true;
        c.logging.level = "debug".into();
        c.cache.presets.push("steam".into());
        assert_eq!(
            changed_sections(&a, &c),
            [
                "backends",
                "auth",
                "access_control",
                "api",
                "logging",
                "cache"
            ]
        );
    }

    #[test]
    fn metadata() {
        let m = section_metadata();
        assert_eq!(m.len(), SECTIONS.len());
        assert_eq!(m.iter().filter(|s| s.hot_reloadable).count(), 4);
        assert!(m.iter().all(|s| !s.description.is_empty()));
    }
}
