//! Active health checks of backends: the server-wide defaults (`server.health_check`), the
//! per-backend `health_check` object that overrides them key by key, the [`HealthCheckPlan`]
//! the two resolve to, and their validation.
//!
//! ```yaml
//! server:
//!   health_check:            # defaults for every backend
//!     enabled: false         # check backends that have no health_check object of their own
//!     interval: 10s          # one check per interval (at least 1s)
//!     timeout: 5s            # a check slower than this failed (shorter than interval)
//!     # target: host:port   # default: api.backend_test_target (as POST /backends/{name}/test)
//!     unhealthy_after: 3     # consecutive failed checks that take a healthy backend out
//!     healthy_after: 2       # consecutive passed checks that bring it back
//! backends:
//!   - name: corp
//!     type: http_proxy
//!     http_proxy: { address: "10.0.0.5:3128" }
//!     health_check: { target: "intranet.example:443", interval: 5s }  # enabled: true implied
//! ```
//!
//! Writing a `health_check` object on a backend turns its checks on unless it says
//! `enabled: false`; its missing keys come from `server.health_check`. A disabled backend
//! (`enabled: false`) is never checked.

use serde::{Deserialize, Serialize};

use crate::model::{BackendConfig, ServerConfig};
use crate::units::Duration;

/// `server.health_check:` — defaults for every backend's active health checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthCheckDefaults {
    /// Check backends that have no `health_check` object of their own.
    pub enabled: bool,
    pub interval: Duration,
    pub timeout: Duration,
    /// `host:port` each check connects to through the backend; unset = `api.backend_test_target`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

impl Default for HealthCheckDefaults {
    /// enabled false, interval 10s, timeout 5s, target `api.backend_test_target`,
    /// unhealthy_after 3, healthy_after 2.
    fn default() -> Self {
        HealthCheckDefaults {
            enabled: false,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            target: None,
            unhealthy_after: 3,
            healthy_after: 2,
        }
    }
}

/// A backend's `health_check:` object; every key is optional and falls back to
/// `server.health_check`, except `enabled`, which is true when the object is written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackendHealthCheck {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unhealthy_after: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy_after: Option<u32>,
}

/// The checks one backend gets: every value resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckPlan {
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
    /// `host:port`
    pub target: String,
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

/// Shortest accepted `interval`: checks are connections through the backend, and a tighter
/// loop would load upstream proxies more than it tells.
pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl HealthCheckPlan {
    /// The checks `backend` gets under `cfg`, or `None` when it is not checked (checks off,
    /// or the backend disabled).
    pub fn for_backend(cfg: &ServerConfig, backend: &BackendConfig) -> Option<HealthCheckPlan> {
        let (plan, enabled) = resolve(cfg, backend);
        (enabled && backend.enabled).then_some(plan)
    }
}

/// The resolved values and whether checks are on, regardless of the backend's own `enabled`.
fn resolve(cfg: &ServerConfig, backend: &BackendConfig) -> (HealthCheckPlan, bool) {
    let d = &cfg.server.health_check;
    let own = backend.health_check.clone().unwrap_or_default();
    let enabled = match &backend.health_check {
        Some(hc) => hc.enabled.unwrap_or(true),
        None => d.enabled,
    };
    let plan = HealthCheckPlan {
        interval: own.interval.unwrap_or(d.interval).as_std(),
        timeout: own.timeout.unwrap_or(d.timeout).as_std(),
        target: own
            .target
            .or_else(|| d.target.clone())
            .unwrap_or_else(|| cfg.api.backend_test_target.clone()),
        unhealthy_after: own.unhealthy_after.unwrap_or(d.unhealthy_after),
        healthy_after: own.healthy_after.unwrap_or(d.healthy_after),
    };
    (plan, enabled)
}

/// Problems of `server.health_check` and of each backend's resolved checks, as
/// (field, message); a backend's problem names the key it wrote, or the default it inherited.
pub(crate) fn problems(cfg: &ServerConfig) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let d = &cfg.server.health_check;
    // The defaults are checked as if written; the target only when set here (the fallback,
    // api.backend_test_target, is checked with the api section).
    let written = BackendHealthCheck {
        target: d.target.clone(),
        ..BackendHealthCheck::default()
    };
    check(
        "server.health_check",
        &written,
        &HealthCheckPlan {
            interval: d.interval.as_std(),
            timeout: d.timeout.as_std(),
            target: d
                .target
                .clone()
                .unwrap_or_else(|| cfg.api.backend_test_target.clone()),
            unhealthy_after: d.unhealthy_after,
            healthy_after: d.healthy_after,
        },
        true,
        &mut out,
    );
    for (i, b) in cfg.backends.iter().enumerate() {
        let Some(own) = &b.health_check else {
            continue;
        };
        let (plan, _) = resolve(cfg, b);
        check(
            &format!("backends[{i}].health_check"),
            own,
            &plan,
            false,
            &mut out,
        );
    }
    out
}

/// Checks `plan`. For a backend (`defaults` false) a value it inherited is reported against
/// `server.health_check` only when the backend's own keys make it wrong (the defaults alone
/// are checked once, above).
fn check(
    base: &str,
    own: &BackendHealthCheck,
    plan: &HealthCheckPlan,
    defaults: bool,
    out: &mut Vec<(String, String)>,
) {
    let field = |key: &str, written: bool| {
        if defaults || written {
            format!("{base}.{key}")
        } else {
            format!("{base}.{key} (from server.health_check)")
        }
    };
    let mine = |written: bool| defaults || written;
    if plan.interval < MIN_INTERVAL && mine(own.interval.is_some()) {
        out.push((
            field("interval", own.interval.is_some()),
            format!(
                "interval {} is too short: at least 1s",
                Duration(plan.interval)
            ),
        ));
    }
    if plan.timeout.is_zero() && mine(own.timeout.is_some()) {
        out.push((
            field("timeout", own.timeout.is_some()),
            "timeout must be greater than 0".into(),
        ));
    } else if plan.timeout >= plan.interval
        && (mine(own.timeout.is_some()) || mine(own.interval.is_some()))
    {
        out.push((
            field("timeout", own.timeout.is_some()),
            format!(
                "timeout {} must be shorter than interval {} (a check must end before the next starts)",
                Duration(plan.timeout),
                Duration(plan.interval)
            ),
        ));
    }
    if own.target.is_some() {
        if let Err(e) = crate::validate::check_host_port(&plan.target) {
            out.push((field("target", own.target.is_some()), e));
        }
    }
    for (key, value, written) in [
        (
            "unhealthy_after",
            plan.unhealthy_after,
            own.unhealthy_after.is_some(),
        ),
        (
            "healthy_after",
            plan.healthy_after,
            own.healthy_after.is_some(),
        ),
    ] {
        if value == 0 && mine(written) {
            out.push((field(key, written), format!("{key} must be at least 1")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> ServerConfig {
        ServerConfig::from_yaml_str(yaml, &|_| None).expect("parse")
    }

    const BACKENDS: &str = "backends:\n  - { name: a, type: direct }\n  - { name: b, type: direct, health_check: { interval: 2s, timeout: 1s, target: \"127.0.0.1:9\" } }\n  - { name: c, type: direct, enabled: false, health_check: {} }\n  - { name: d, type: direct, health_check: { enabled: false } }\n";

    #[test]
    fn an_object_turns_checks_on_and_inherits_missing_keys() {
        let c = cfg(BACKENDS);
        assert_eq!(HealthCheckPlan::for_backend(&c, &c.backends[0]), None);
        let b = HealthCheckPlan::for_backend(&c, &c.backends[1]).expect("b is checked");
        assert_eq!(
            b,
            HealthCheckPlan {
                interval: std::time::Duration::from_secs(2),
                timeout: std::time::Duration::from_secs(1),
                target: "127.0.0.1:9".into(),
                unhealthy_after: 3,
                healthy_after: 2,
            }
        );
        assert_eq!(
            HealthCheckPlan::for_backend(&c, &c.backends[2]),
            None,
            "a disabled backend is not checked"
        );
        assert_eq!(HealthCheckPlan::for_backend(&c, &c.backends[3]), None);
        assert!(problems(&c).is_empty(), "{:?}", problems(&c));
    }

    #[test]
    fn server_wide_defaults_apply_to_backends_without_an_object() {
        let c = cfg(&format!(
            "server:\n  health_check: {{ enabled: true, interval: 30s, unhealthy_after: 5 }}\napi: {{ backend_test_target: \"probe.example:443\" }}\n{BACKENDS}"
        ));
        let a = HealthCheckPlan::for_backend(&c, &c.backends[0]).expect("a is checked");
        assert_eq!(a.interval, std::time::Duration::from_secs(30));
        assert_eq!(a.timeout, std::time::Duration::from_secs(5));
        assert_eq!(a.target, "probe.example:443");
        assert_eq!((a.unhealthy_after, a.healthy_after), (5, 2));
        let b = HealthCheckPlan::for_backend(&c, &c.backends[1]).expect("b");
        assert_eq!(b.unhealthy_after, 5, "inherited key by key");
        assert_eq!(HealthCheckPlan::for_backend(&c, &c.backends[3]), None);
    }

    #[test]
    fn defaults_round_trip_and_stay_out_of_backends() {
        let c = cfg(BACKENDS);
        let yaml = c.to_yaml_string().expect("yaml");
        assert!(yaml.contains("health_check:"), "{yaml}");
        assert_eq!(cfg(&yaml), c);
        assert!(c.backends[0].health_check.is_none());
    }

    fn fields(yaml: &str) -> Vec<String> {
        problems(&cfg(yaml)).into_iter().map(|(f, _)| f).collect()
    }

    #[test]
    fn validation_names_the_key_at_fault() {
        assert_eq!(
            fields("backends:\n  - { name: a, type: direct, health_check: { interval: 500ms, timeout: 100ms } }\n"),
            ["backends[0].health_check.interval"]
        );
        assert_eq!(
            fields("backends:\n  - { name: a, type: direct, health_check: { interval: 2s, timeout: 2s } }\n"),
            ["backends[0].health_check.timeout"]
        );
        // 1s interval with the default 5s timeout: the inherited timeout is what is wrong.
        assert_eq!(
            fields("backends:\n  - { name: a, type: direct, health_check: { interval: 1s } }\n"),
            ["backends[0].health_check.timeout (from server.health_check)"]
        );
        assert_eq!(
            fields("backends:\n  - { name: a, type: direct, health_check: { target: nope, timeout: 0s, healthy_after: 0 } }\n"),
            [
                "backends[0].health_check.timeout",
                "backends[0].health_check.target",
                "backends[0].health_check.healthy_after"
            ]
        );
        assert_eq!(
            fields("server:\n  health_check: { interval: 5s, timeout: 5s, target: \"x:1\", unhealthy_after: 0 }\n"),
            [
                "server.health_check.timeout",
                "server.health_check.unhealthy_after"
            ]
        );
    }

    #[test]
    fn unknown_keys_are_parse_errors() {
        assert!(ServerConfig::from_yaml_str(
            "backends:\n  - { name: a, type: direct, health_check: { intervall: 5s } }\n",
            &|_| None
        )
        .is_err());
    }
}
