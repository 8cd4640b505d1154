//! The split-tunnel rule model of the spec (`vpn.split.*`, `GET /api/v1/vpn/split/rules`) and its
//! compiled form. Runtime-free.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use switchyard_proto::route_matcher::{DomainPattern, RouteEntry, RouteTable};

/// The mode is the configuration's own type: one definition for `vpn.split.mode` everywhere.
pub use switchyard_config::client::SplitMode;

/// One app of `vpn.split.apps`. On Linux an app is matched by process name (`name`, compared with
/// `/proc/PID/comm`), by executable `path` (`/proc/PID/exe`), or — when `cgroup` is set — is every
/// process of that cgroup v2 directory (absolute, or relative to the cgroup2 mount).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppRule {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// macOS only; accepted and ignored on Linux.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_id: Option<String>,
}

/// Split tunnel rules as the spec names them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRules {
    #[serde(default)]
    pub mode: SplitMode,
    #[serde(default)]
    pub apps: Vec<AppRule>,
    #[serde(default)]
    pub domains: Vec<String>,
    #[serde(default)]
    pub ips: Vec<String>,
    #[serde(default)]
    pub always_bypass: Vec<String>,
}

/// Why a rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("`{0}` is neither an IP address nor a CIDR")]
    BadNet(String),
    #[error("domain pattern `{0}`: {1}")]
    BadDomain(String, String),
    #[error("app `{0}` has no name, path or cgroup to match")]
    EmptyApp(String),
}

/// Parses a single IPv4/IPv6 address (a host network) or a CIDR.
pub fn parse_net(s: &str) -> Result<IpNet, RuleError> {
    let s = s.trim();
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(switchyard_ebpf::host_net)
        .map_err(|_| RuleError::BadNet(s.to_string()))
}

/// Rules checked and compiled for matching.
#[derive(Debug)]
pub struct CompiledRules {
    pub mode: SplitMode,
    pub apps: Vec<AppRule>,
    pub nets: Vec<IpNet>,
    pub bypass: Vec<IpNet>,
    domains: RouteTable<()>,
}

impl CompiledRules {
    pub fn compile(rules: &SplitRules) -> Result<Self, RuleError> {
        let nets = rules
            .ips
            .iter()
            .map(|s| parse_net(s))
            .collect::<Result<Vec<_>, _>>()?;
        let bypass = rules
            .always_bypass
            .iter()
            .map(|s| parse_net(s))
            .collect::<Result<Vec<_>, _>>()?;
        for app in &rules.apps {
            if app.name.trim().is_empty() && app.path.is_none() && app.cgroup.is_none() {
                return Err(RuleError::EmptyApp(app.name.clone()));
            }
        }
        for pattern in &rules.domains {
            DomainPattern::parse(pattern)
                .map_err(|e| RuleError::BadDomain(pattern.clone(), e.to_string()))?;
        }
        let entry = RouteEntry {
            patterns: rules.domains.clone(),
            priority: 0,
            value: (),
        };
        let domains = RouteTable::build(vec![entry])
            .map_err(|e| RuleError::BadDomain(String::new(), e.to_string()))?;
        Ok(CompiledRules {
            mode: rules.mode,
            apps: rules.apps.clone(),
            nets,
            bypass,
            domains,
        })
    }

    /// Whether a resolved name falls under a domain rule (so its addresses join the split set).
    pub fn domain_matches(&self, domain: &str) -> bool {
        self.domains.lookup(domain).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(domains: &[&str], ips: &[&str]) -> SplitRules {
        SplitRules {
            domains: domains.iter().map(|s| s.to_string()).collect(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            ..SplitRules::default()
        }
    }

    #[test]
    fn nets_accept_ips_cidrs_and_v6() {
        assert_eq!(
            parse_net("10.1.2.3").expect("ip").to_string(),
            "10.1.2.3/32"
        );
        assert_eq!(
            parse_net("10.1.2.3/8").expect("cidr").to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            parse_net("2001:db8::1").expect("v6").to_string(),
            "2001:db8::1/128"
        );
        assert_eq!(
            parse_net("[2001:db8::1]").expect("v6").to_string(),
            "2001:db8::1/128"
        );
        assert_eq!(
            parse_net("2001:db8::/32").expect("v6 cidr").to_string(),
            "2001:db8::/32"
        );
        assert!(matches!(
            parse_net("10.0.0.0/33"),
            Err(RuleError::BadNet(_))
        ));
        assert!(matches!(
            parse_net("example.com"),
            Err(RuleError::BadNet(_))
        ));
    }

    #[test]
    fn domains_use_the_route_matcher_semantics() {
        let c = CompiledRules::compile(&rules(&["example.com", "*.video.test", "cdn*.*.net"], &[]))
            .expect("compile");
        assert!(c.domain_matches("example.com"));
        assert!(!c.domain_matches("www.example.com"));
        assert!(c.domain_matches("a.b.video.test"));
        assert!(!c.domain_matches("video.test"));
        assert!(c.domain_matches("cdn7.edge.net"));
        assert!(!c.domain_matches("img.edge.net"));
        assert!(c.domain_matches("EXAMPLE.com."));
    }

    #[test]
    fn bad_entries_are_refused_with_the_culprit() {
        let err = CompiledRules::compile(&rules(&[], &["10.0.0.1", "nope"])).expect_err("bad ip");
        assert_eq!(err, RuleError::BadNet("nope".into()));
        let err = CompiledRules::compile(&rules(&["ok.com", "a..b"], &[])).expect_err("bad domain");
        assert!(matches!(err, RuleError::BadDomain(p, _) if p == "a..b"));
    }

    #[test]
    fn rules_read_the_spec_json() {
        let r: SplitRules = serde_json::from_str(
            r#"{"mode":"include","apps":[{"name":"firefox","path":"/usr/bin/firefox"}],
                "domains":["*.example.com"],"ips":["10.0.0.0/8"],"always_bypass":["192.168.0.0/16"]}"#,
        )
        .expect("json");
        assert_eq!(r.mode, SplitMode::Include);
        assert_eq!(r.apps[0].path.as_deref(), Some("/usr/bin/firefox"));
        let c = CompiledRules::compile(&r).expect("compile");
        assert_eq!(c.bypass[0].to_string(), "192.168.0.0/16");
    }
}
