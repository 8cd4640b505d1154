//! Loading (`${NAME}` expansion → strict YAML → defaults) and serialization.

use std::path::{Path, PathBuf};

use crate::env::{expand_env, EnvError};
use crate::key_path::{key_path_at, Target};
use crate::model::ServerConfig;

/// Why a configuration could not be loaded. `Display` is one line, suitable for
/// `switchyard config validate` and log messages.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `${NAME}` names an unset environment variable.
    #[error("{}environment variable `{name}` is not set (referenced on line {line}; write $$ for a literal $)", file_prefix(file))]
    EnvVarMissing {
        /// The file, when loaded from one.
        file: Option<PathBuf>,
        /// The variable.
        name: String,
        /// 1-based line of the reference.
        line: usize,
    },
    /// A malformed `${…}` reference.
    #[error(
        "{}bad environment reference on line {line}: {message}",
        file_prefix(file)
    )]
    EnvSyntax {
        /// The file, when loaded from one.
        file: Option<PathBuf>,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// YAML syntax error, unknown key, wrong type, bad value (unknown backend type, bad
    /// duration, …).
    #[error("{}{}", file_prefix(file), parse_display(path, *line, *column, message))]
    Parse {
        /// The file, when loaded from one.
        file: Option<PathBuf>,
        /// Key path such as `server.http.lisen` or `backends[2].type` (empty = document root).
        path: String,
        /// 1-based line, when known.
        line: Option<u64>,
        /// 1-based column, when known.
        column: Option<u64>,
        /// What is wrong.
        message: String,
    },
}

fn file_prefix(file: &Option<PathBuf>) -> String {
    match file {
        Some(f) => format!("{}: ", f.display()),
        None => String::new(),
    }
}

fn parse_display(path: &str, line: Option<u64>, column: Option<u64>, message: &str) -> String {
    let mut s = String::from(if path.is_empty() {
        "document root"
    } else {
        path
    });
    match (line, column) {
        (Some(l), Some(c)) => s.push_str(&format!(" (line {l}, column {c})")),
        (Some(l), None) => s.push_str(&format!(" (line {l})")),
        _ => {}
    }
    format!("{s}: {message}")
}

impl LoadError {
    fn with_file(mut self, path: &Path) -> Self {
        match &mut self {
            LoadError::EnvVarMissing { file, .. }
            | LoadError::EnvSyntax { file, .. }
            | LoadError::Parse { file, .. } => *file = Some(path.to_path_buf()),
            LoadError::Io { .. } => {}
        }
        self
    }
}

impl From<EnvError> for LoadError {
    fn from(e: EnvError) -> Self {
        match e {
            EnvError::Missing { name, line } => LoadError::EnvVarMissing {
                file: None,
                name,
                line,
            },
            EnvError::Syntax { line, message } => LoadError::EnvSyntax {
                file: None,
                line,
                message,
            },
        }
    }
}

/// Serialization failed (should not happen for a well-formed model).
#[derive(Debug, thiserror::Error)]
#[error("cannot serialize config: {0}")]
pub struct SerializeError(String);

/// One line of a saphyr error: drop the source snippet and any location suffix it renders
/// itself (we print path, line and column separately).
fn saphyr_message(err: &serde_saphyr::Error) -> String {
    let full = err.without_snippet().to_string();
    let first = full.lines().next().unwrap_or("").trim();
    let msg = first.split(" at line ").next().unwrap_or(first).trim();
    let msg = msg
        .strip_suffix(", set DuplicateKeyPolicy in Options if acceptable")
        .unwrap_or(msg);
    match msg {
        "invalid u8" | "invalid u16" | "invalid u32" | "invalid u64" | "invalid usize"
        | "invalid u128" => "expected a non-negative integer".to_string(),
        "invalid i8" | "invalid i16" | "invalid i32" | "invalid i64" | "invalid isize"
        | "invalid i128" => "expected an integer".to_string(),
        "invalid f32" | "invalid f64" => "expected a number".to_string(),
        "invalid bool" => "expected true or false".to_string(),
        m if m.starts_with("cannot deserialize null into") => {
            "a value is required here (found an empty value)".to_string()
        }
        other => other.to_string(),
    }
}

/// The error under saphyr's wrappers (source snippet, alias use) that say what went wrong.
fn innermost(mut err: &serde_saphyr::Error) -> &serde_saphyr::Error {
    while let serde_saphyr::Error::WithSnippet { error, .. }
    | serde_saphyr::Error::AliasError { error, .. } = err
    {
        err = error;
    }
    err
}

/// The error's location resolved to a key path in `text`, the document it came from.
fn parse_error(text: &str, err: &serde_saphyr::Error) -> LoadError {
    let loc = err.location();
    let line = loc.map(|l| l.line()).filter(|l| *l > 0);
    let column = loc.map(|l| l.column()).filter(|c| *c > 0);
    let target = match innermost(err) {
        serde_saphyr::Error::SerdeUnknownField { .. } => Target::Key,
        serde_saphyr::Error::SerdeMissingField { .. }
        | serde_saphyr::Error::DuplicateMappingKey { .. } => Target::Mapping,
        _ => Target::Value,
    };
    let path = match (line, column) {
        (Some(line), Some(column)) => key_path_at(text, line, column, target),
        _ => String::new(),
    };
    LoadError::Parse {
        file: None,
        path,
        line,
        column,
        message: saphyr_message(err),
    }
}

/// `true` when the text holds no YAML content (only blanks, comments, `---`/`...`).
fn is_blank_document(text: &str) -> bool {
    text.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || t == "---" || t == "..."
    })
}

/// Strict YAML for any configuration type: `${NAME}` expansion with `env`, unknown keys are
/// errors naming their path, a blank document is all defaults.
pub(crate) fn parse_strict_yaml<T: serde::de::DeserializeOwned + Default>(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<T, LoadError> {
    let expanded = expand_env(text, env)?;
    if is_blank_document(&expanded) {
        return Ok(T::default());
    }
    deserialize_tracked(&expanded)
}

/// Strict YAML text (already expanded) into `T`, errors naming the key path. The one place a
/// configuration type's deserializer is instantiated: every input format comes through here
/// (JSON as text, see [`from_json_value`]), so the binary carries one copy per type. The path
/// comes from the error's location (see [`key_path_at`]), not from wrapping the deserializer.
fn deserialize_tracked<T: serde::de::DeserializeOwned + Default>(
    text: &str,
) -> Result<T, LoadError> {
    serde_saphyr::with_deserializer_from_str(text, |de| T::deserialize(de))
        .map_err(|err| parse_error(text, &err))
}

/// Why a JSON configuration value does not deserialize: the key path (empty = the root) and
/// what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", if path.is_empty() { "document root" } else { path })]
pub struct JsonValueError {
    /// Key path such as `server.http.lisen` or `backends[2].type`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// A configuration posted as JSON, deserialized strictly like a file (unknown keys are errors
/// naming their path) but without `${NAME}` expansion. JSON is YAML, so the value goes through
/// the files' deserializer as text instead of through `serde_json::Value`'s: one instantiation
/// of each configuration type's deserializer instead of two (issue 14: ~1 MB of
/// the binary).
pub(crate) fn from_json_value<T: serde::de::DeserializeOwned + Default>(
    value: &serde_json::Value,
) -> Result<T, JsonValueError> {
    let text = serde_json::to_string(value).map_err(|e| JsonValueError {
        path: String::new(),
        message: e.to_string(),
    })?;
    deserialize_tracked(&text).map_err(|e| match e {
        LoadError::Parse { path, message, .. } => JsonValueError { path, message },
        other => JsonValueError {
            path: String::new(),
            message: other.to_string(),
        },
    })
}

/// [`parse_strict_yaml`] of a file, expanding `${NAME}` from the process environment; errors
/// name the file.
pub(crate) fn load_strict_yaml_file<T: serde::de::DeserializeOwned + Default>(
    path: &Path,
) -> Result<T, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_strict_yaml(&text, &|name| std::env::var(name).ok()).map_err(|e| e.with_file(path))
}

impl ServerConfig {
    /// Parse configuration text: `${NAME}` expansion with `env`, then strict YAML (unknown keys
    /// are errors naming their path), then defaults for everything missing.
    pub fn from_yaml_str(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ServerConfig, LoadError> {
        parse_strict_yaml(text, env)
    }

    /// Read and parse a config file, expanding `${NAME}` from the process environment.
    pub fn load_file(path: &Path) -> Result<ServerConfig, LoadError> {
        load_strict_yaml_file(path)
    }

    /// A configuration posted as JSON: strict, errors naming the key path, no `${NAME}`
    /// expansion (see [`from_json_value`]).
    pub fn from_json_value(value: &serde_json::Value) -> Result<ServerConfig, JsonValueError> {
        from_json_value(value)
    }

    /// The configuration as YAML, with the same keys it is read with.
    pub fn to_yaml_string(&self) -> Result<String, SerializeError> {
        serde_saphyr::to_string(self).map_err(|e| SerializeError(e.to_string()))
    }

    /// The configuration as a JSON value (the management API's shape).
    pub fn to_json_value(&self) -> Result<serde_json::Value, SerializeError> {
        serde_json::to_value(self).map_err(|e| SerializeError(e.to_string()))
    }
}

/// `from_yaml_str`, `load_file` and `to_yaml_string` for a service configuration type (the
/// `pkgcache`, `inventory` and `subtitles` sections), all through the strict loader above.
macro_rules! strict_yaml_entry_points {
    ($t:ty) => {
        impl $t {
            /// Parse configuration text: `${NAME}` expansion with `env`, strict YAML, defaults.
            pub fn from_yaml_str(
                text: &str,
                env: &dyn Fn(&str) -> Option<String>,
            ) -> Result<$t, $crate::load::LoadError> {
                $crate::load::parse_strict_yaml(text, env)
            }

            /// Read and parse a file, expanding `${NAME}` from the process environment.
            pub fn load_file(path: &std::path::Path) -> Result<$t, $crate::load::LoadError> {
                $crate::load::load_strict_yaml_file(path)
            }

            /// A configuration posted as JSON: strict, errors naming the key path, no
            /// `${NAME}` expansion (one deserializer for both formats, issue 14).
            pub fn from_json_value(
                value: &serde_json::Value,
            ) -> Result<$t, $crate::load::JsonValueError> {
                $crate::load::from_json_value(value)
            }

            /// The configuration as YAML, with the same keys it is read with.
            pub fn to_yaml_string(&self) -> Result<String, String> {
                serde_saphyr::to_string(self).map_err(|e| e.to_string())
            }
        }
    };
}
pub(crate) use strict_yaml_entry_points;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::*;
    use crate::units::{Duration, Size};

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn load(text: &str) -> Result<ServerConfig, LoadError> {
        ServerConfig::from_yaml_str(text, &no_env)
    }

    /// Path, line and message of a parse error.
    fn parts<T: std::fmt::Debug>(result: Result<T, LoadError>) -> (String, Option<u64>, String) {
        match result {
            Err(LoadError::Parse {
                path,
                line,
                message,
                ..
            }) => (path, line, message),
            other => panic!("expected parse error, got {other:?}"),
        }
    }

    fn parse_err(text: &str) -> (String, Option<u64>, String) {
        parts(load(text))
    }

    #[test]
    fn empty_file_is_all_defaults() {
        let cfg = load("").unwrap();
        assert_eq!(cfg, ServerConfig::default());
        let cfg2 = load("# only a comment\n---\n").unwrap();
        assert_eq!(cfg2, cfg);
        assert_eq!(cfg.server.http.listen, ":7080");
        assert_eq!(cfg.server.http.read_timeout, Duration::from_secs(60));
        assert_eq!(cfg.server.http.write_timeout, Duration::from_secs(60));
        assert_eq!(cfg.server.http.idle_timeout, Duration::from_secs(120));
        assert_eq!(cfg.server.http.header_timeout, Duration::from_secs(10));
        assert_eq!(cfg.server.http.max_header_size, Size(64 * 1024));
        assert!(cfg.server.socks5.enabled);
        assert_eq!(cfg.server.socks5.listen, ":7180");
        assert_eq!(cfg.server.cores, 0);
        assert_eq!(cfg.server.max_connections, 10_000);
        assert!(cfg.api.enabled);
        assert_eq!(cfg.api.listen, "127.0.0.1:7082");
        // Not an open proxy: local networks only, until the operator says otherwise.
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.31.0.1",
            "192.168.0.9",
            "169.254.1.1",
            "::1",
        ] {
            assert!(cfg.access_control.allows(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["fe80::1", "fd00::5", "::ffff:192.168.1.1"] {
            assert!(cfg.access_control.allows(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "172.32.0.1", "100.64.0.1", "2001:db8::1"] {
            assert!(!cfg.access_control.allows(ip.parse().unwrap()), "{ip}");
        }
        let only_blacklist = load("access_control: {blacklist: [10.9.0.0/16]}\n").unwrap();
        assert!(!only_blacklist
            .access_control
            .allows("8.8.8.8".parse().unwrap()));
        assert!(!only_blacklist
            .access_control
            .allows("10.9.1.1".parse().unwrap()));
        let open = load("access_control: {whitelist: []}\n").unwrap();
        assert!(open.access_control.allows("8.8.8.8".parse().unwrap()));
        assert_eq!(open.access_control.describe(), "every address");
        assert_eq!(cfg.api.request_log_size, 1000);
        assert!(!cfg.api.enable_request_log);
        assert_eq!(cfg.logging.level, "info");
        assert_eq!(cfg.logging.format, LogFormat::Text);
        assert!(!cfg.metrics.enabled);
        assert_eq!(cfg.metrics.listen, ":7090");
        assert_eq!(cfg.auth.mode, AuthMode::None);
        assert_eq!(cfg.backends, vec![BackendConfig::direct("direct")]);
        assert_eq!(cfg.routes.len(), 1);
        assert_eq!(cfg.routes[0].name, "default");
        assert_eq!(cfg.routes[0].domains, vec!["*"]);
        assert_eq!(cfg.routes[0].backend.as_deref(), Some("direct"));
    }

    #[test]
    fn default_backend_only_when_both_keys_absent() {
        let cfg = load("backends: []\nroutes: []\n").unwrap();
        assert!(cfg.backends.is_empty() && cfg.routes.is_empty());
        let cfg = load("backends:\n  - {name: d, type: direct}\n").unwrap();
        assert_eq!(cfg.backends.len(), 1);
        assert!(cfg.routes.is_empty());
        let cfg = load("routes: []\n").unwrap();
        assert!(cfg.backends.is_empty());
    }

    #[test]
    fn partial_sections_keep_other_defaults() {
        let cfg = load("server:\n  http:\n    read_timeout: 5s\n").unwrap();
        assert_eq!(cfg.server.http.read_timeout, Duration::from_secs(5));
        assert_eq!(cfg.server.http.listen, ":7080");
        assert_eq!(cfg.server.http.idle_timeout, Duration::from_secs(120));
        assert!(cfg.server.socks5.enabled);
    }

    #[test]
    fn empty_sections_are_defaults() {
        let cfg =
            load("server:\n  pac:\n  http:\nlogging:\nauth:\n  native:\n    users:\n").unwrap();
        assert_eq!(cfg, ServerConfig::default());
    }

    #[test]
    fn unknown_key_names_full_path() {
        let (path, line, msg) = parse_err("server:\n  http:\n    lisen: \":1\"\n");
        assert_eq!(path, "server.http.lisen");
        assert_eq!(line, Some(3));
        assert!(msg.contains("lisen"), "{msg}");
        let (path, _, _) = parse_err(
            "backends:\n  - name: a\n    type: direct\n  - name: b\n    type: httpproxy\n    http_proxy:\n      adress: x:1\n",
        );
        assert_eq!(path, "backends[1].http_proxy.adress");
        let (path, _, _) = parse_err("bogus: 1\n");
        assert_eq!(path, "bogus");
    }

    #[test]
    fn unknown_backend_type_lists_accepted() {
        let err = load("backends:\n  - name: a\n    type: ipsec\n").unwrap_err();
        let text = err.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("backends[0].type"), "{text}");
        assert!(text.contains("ipsec"), "{text}");
        assert!(text.contains("httpproxy, http_proxy"), "{text}");
        assert!(text.contains("line 3"), "{text}");
    }

    #[test]
    fn bad_values_are_parse_errors_with_path() {
        let (path, _, msg) = parse_err("server:\n  http:\n    read_timeout: 5 parsecs\n");
        assert_eq!(path, "server.http.read_timeout");
        assert!(msg.contains("5 parsecs"), "{msg}");
        let (path, _, msg) = parse_err("access_control:\n  whitelist: [10.0.0.0/8, nope]\n");
        assert_eq!(path, "access_control.whitelist[1]");
        assert!(msg.contains("nope"), "{msg}");
        let (path, _, _) = parse_err("auth:\n  mode: kerberos\n");
        assert_eq!(path, "auth.mode");
        let (_, _, msg) = parse_err("auth:\n  mode: negotiate\n");
        assert!(msg.contains("auth.negotiate"), "{msg}");
        let (path, _, msg) = parse_err("server:\n  cores: many\n");
        assert_eq!(path, "server.cores");
        assert_eq!(msg, "expected a non-negative integer");
        let (path, line, msg) = parse_err("server:\n  http:\n    listen: :1\n    listen: :2\n");
        assert_eq!(path, "server.http");
        assert_eq!(line, Some(4));
        assert!(msg.contains("duplicate") && msg.contains("listen"), "{msg}");
        let err = load("- a\n- b\n").unwrap_err().to_string();
        assert!(err.starts_with("document root (line 1, column 1)"), "{err}");
    }

    #[test]
    fn empty_scalar_message() {
        let (path, _, msg) = parse_err("logging: {level: }\n");
        assert_eq!(path, "logging.level");
        assert!(msg.contains("value is required"), "{msg}");
    }

    #[test]
    fn second_document_is_rejected() {
        assert!(load("logging: {level: debug}\n---\nlogging: {level: info}\n").is_err());
    }

    #[test]
    fn yaml_syntax_error_has_line() {
        let err = load("server:\n  http: [\n").unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, LoadError::Parse { line: Some(_), .. }),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
    }

    #[test]
    fn backend_shapes_and_aliases() {
        let cfg = load(
            r#"
backends:
  - name: d
    type: direct
  - name: up
    type: http_proxy
    httpproxy: {address: "proxy.example:3128", username: u, password: p}
  - name: up2
    type: httpproxy
    http_proxy: {address: "proxy.example:3128"}
    enabled: false
  - name: s
    type: socks5_proxy
    socks5_proxy: {address: "127.0.0.1:1080"}
  - name: s2
    type: socks5
    socks5: {address: "127.0.0.1:1080"}
  - name: wg
    type: wireguard
    wireguard: {private_key: abc, peers: [{endpoint: "1.2.3.4:51820"}]}
  - name: ovpn
    type: openvpn
routes:
  - {name: r, domains: ["*"], backend: d}
"#,
        )
        .unwrap();
        let b = &cfg.backends;
        assert_eq!(b[0].kind, BackendType::Direct);
        assert!(b[0].enabled);
        assert_eq!(b[1].kind, BackendType::HttpProxy);
        let hp = b[1].http_proxy.as_ref().unwrap();
        assert_eq!(hp.address, "proxy.example:3128");
        assert_eq!(hp.username.as_deref(), Some("u"));
        assert_eq!(hp.password.as_deref(), Some("p"));
        assert!(!b[2].enabled);
        assert_eq!(b[3].kind, BackendType::Socks5);
        assert_eq!(b[3].socks5.as_ref().unwrap().address, "127.0.0.1:1080");
        assert_eq!(b[4].upstream().unwrap().address, "127.0.0.1:1080");
        assert_eq!(b[5].kind, BackendType::Wireguard);
        assert_eq!(
            b[5].other.as_ref().unwrap()["peers"][0]["endpoint"],
            "1.2.3.4:51820"
        );
        assert_eq!(b[6].other, None);
    }

    #[test]
    fn mismatched_raw_settings_object_is_error() {
        let err = load("backends:\n  - name: x\n    type: direct\n    wireguard: {a: 1}\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("wireguard") && err.contains("backends[0]"),
            "{err}"
        );
    }

    #[test]
    fn routes_auth_access_rate_shapes() {
        let cfg = load(
            r#"
backends: [{name: a, type: direct}, {name: b, type: direct}]
routes:
  - name: lb
    domains: ["*.example.com", "cdn*.example.org"]
    backends: [a, b]
    priority: 10
    load_balance: least_conn
  - name: one
    domains: [example.net]
    backend: a
    enabled: false
auth:
  mode: native
  native:
    users:
      - username: alice
        password_hash: "$2b$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"
access_control:
  whitelist: [10.0.0.0/8, 192.168.1.7, "::1", "10.1.2.3/16"]
  blacklist: []
rate_limit:
  enabled: true
  requests_per_second: 12.5
  burst_size: 20
  per_ip: true
  bandwidth: {upload: 1MiB, download: 2MB}
api:
  token: t0k
  allowed_origins: ["https://admin.example.com"]
  enable_request_log: true
  request_log_size: 50
logging: {level: debug, format: json, output: /var/log/sy.log}
metrics: {enabled: true, listen: "127.0.0.1:7090"}
server:
  pac: {proxy_host: "proxy.lan:7080"}
"#,
        )
        .unwrap();
        let r = &cfg.routes[0];
        assert_eq!(r.backends, vec!["a", "b"]);
        assert_eq!(r.backend, None);
        assert_eq!(r.priority, 10);
        assert_eq!(r.load_balance, LoadBalance::LeastConn);
        assert!(r.enabled);
        assert!(!cfg.routes[1].enabled);
        assert_eq!(cfg.routes[1].load_balance, LoadBalance::RoundRobin);
        assert_eq!(cfg.auth.mode, AuthMode::Native);
        assert_eq!(cfg.auth.native.users[0].username, "alice");
        let wl: Vec<String> = cfg
            .access_control
            .whitelist
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            wl,
            ["10.0.0.0/8", "192.168.1.7/32", "::1/128", "10.1.0.0/16"]
        );
        assert!(cfg.access_control.allows("10.9.9.9".parse().unwrap()));
        assert!(!cfg.access_control.allows("11.0.0.1".parse().unwrap()));
        assert!(cfg
            .access_control
            .allows("::ffff:10.0.0.1".parse().unwrap()));
        assert_eq!(cfg.rate_limit.requests_per_second, 12.5);
        assert_eq!(cfg.rate_limit.burst_size, 20);
        assert_eq!(cfg.rate_limit.bandwidth.upload, Size(1 << 20));
        assert_eq!(cfg.rate_limit.bandwidth.download, Size(2_000_000));
        assert_eq!(cfg.api.token.as_deref(), Some("t0k"));
        assert_eq!(cfg.api.request_log_size, 50);
        assert_eq!(cfg.logging.format, LogFormat::Json);
        assert_eq!(cfg.logging.output.as_deref(), Some("/var/log/sy.log"));
        assert!(cfg.metrics.enabled);
        assert_eq!(cfg.server.pac.proxy_host.as_deref(), Some("proxy.lan:7080"));
    }

    #[test]
    fn unimplemented_auth_modes_parse() {
        let cfg = load(
            "auth:\n  mode: ldap\n  ldap:\n    url: ldaps://dir.example\n    base_dn: dc=example\n    user_filter: (uid=%s)\n",
        )
        .unwrap();
        assert_eq!(cfg.auth.mode, AuthMode::Ldap);
        assert_eq!(cfg.auth.ldap.unwrap().base_dn, "dc=example");
        assert_eq!(
            load("auth: {mode: oauth}").unwrap().auth.mode,
            AuthMode::Oauth
        );
        assert_eq!(
            load("auth: {mode: system}").unwrap().auth.mode,
            AuthMode::System
        );
    }

    #[test]
    fn env_expansion_in_load() {
        let env = |n: &str| (n == "API_TOKEN").then(|| "abc123".to_string());
        let cfg = ServerConfig::from_yaml_str("api:\n  token: \"${API_TOKEN}\"\n", &env).unwrap();
        assert_eq!(cfg.api.token.as_deref(), Some("abc123"));
        let err =
            ServerConfig::from_yaml_str("api:\n  token: ${MISSING_TOKEN}\n", &env).unwrap_err();
        assert!(
            matches!(&err, LoadError::EnvVarMissing { name, line: 2, .. } if name == "MISSING_TOKEN")
        );
        assert!(err.to_string().contains("MISSING_TOKEN"));
    }

    #[test]
    fn load_file_io_and_file_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.yaml");
        let err = ServerConfig::load_file(&missing).unwrap_err();
        assert!(matches!(err, LoadError::Io { .. }));
        assert!(err.to_string().contains("nope.yaml"));

        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "server:\n  bogus: 1\n").unwrap();
        let err = ServerConfig::load_file(&bad).unwrap_err().to_string();
        assert!(err.starts_with(&bad.display().to_string()), "{err}");
        assert!(err.contains("server.bogus"), "{err}");

        let good = dir.path().join("good.yaml");
        std::fs::write(&good, "logging: {level: warn}\n").unwrap();
        assert_eq!(
            ServerConfig::load_file(&good).unwrap().logging.level,
            "warn"
        );
    }

    fn rich_config() -> ServerConfig {
        load(
            r#"
server:
  http: {listen: "127.0.0.1:8080", read_timeout: 1m30s, idle_timeout: 720h, max_header_size: 1536}
  pac: {proxy_host: "p:1"}
backends:
  - {name: d, type: direct}
  - {name: h, type: http_proxy, http_proxy: {address: "h:1", username: u, password: p}}
  - {name: s, type: socks5, socks5: {address: "s:1"}, enabled: false}
  - {name: w, type: wireguard, wireguard: {k: [1, 2, {x: "y"}]}}
  - {name: o, type: openvpn, openvpn: {config: /etc/o.conf}}
routes:
  - {name: a, domains: ["*"], backends: [d, h], load_balance: least_conn, priority: -3}
  - {name: b, domains: [x.com], backend: d, enabled: false}
auth:
  mode: native
  native: {users: [{username: alice, password_hash: "$2b$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"}]}
  oauth: {issuer_url: "https://id", client_id: c, client_secret: s}
access_control: {whitelist: [10.0.0.0/8], blacklist: ["::1"]}
rate_limit: {enabled: true, requests_per_second: 2.5, burst_size: 3, per_ip: true, bandwidth: {upload: 2GB, download: 1000001}}
api: {token: t, allowed_origins: ["a.example:8443"], enable_request_log: true, request_log_size: 7}
logging: {level: debug, format: json, output: /tmp/x.log}
metrics: {enabled: true, listen: ":9"}
"#,
        )
        .unwrap()
    }

    #[test]
    fn json_round_trip() {
        let cfg = rich_config();
        let v = serde_json::to_value(&cfg).unwrap();
        assert_eq!(v["server"]["http"]["read_timeout"], "1m30s");
        assert_eq!(v["server"]["http"]["idle_timeout"], "720h0m0s");
        assert_eq!(v["server"]["http"]["max_header_size"], "1536");
        assert_eq!(v["backends"][1]["type"], "httpproxy");
        assert_eq!(v["backends"][1]["http_proxy"]["address"], "h:1");
        assert_eq!(v["backends"][3]["wireguard"]["k"][2]["x"], "y");
        assert_eq!(v["backends"][4]["openvpn"]["config"], "/etc/o.conf");
        assert_eq!(v["routes"][0]["load_balance"], "least_conn");
        assert!(v["routes"][0].get("backend").is_none());
        assert_eq!(v["auth"]["mode"], "native");
        assert_eq!(v["access_control"]["blacklist"][0], "::1/128");
        assert_eq!(v["rate_limit"]["bandwidth"]["upload"], "2GB");
        let back: ServerConfig = serde_json::from_value(v).unwrap();
        assert_eq!(back, cfg);
        // defaults round-trip too
        let d = ServerConfig::default();
        let back: ServerConfig = serde_json::from_value(d.to_json_value().unwrap()).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn yaml_round_trip() {
        for cfg in [
            rich_config(),
            ServerConfig::default(),
            load("backends: []\nroutes: []").unwrap(),
        ] {
            let text = cfg.to_yaml_string().unwrap();
            let back = load(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(back, cfg, "{text}");
        }
    }

    #[test]
    fn json_rejects_unknown_keys_too() {
        let mut v = serde_json::to_value(ServerConfig::default()).unwrap();
        v["api"]["bogus"] = serde_json::json!(1);
        assert!(serde_json::from_value::<ServerConfig>(v).is_err());
    }

    #[test]
    fn json_value_through_the_yaml_deserializer() {
        // the API's JSON shape of a rich configuration comes back unchanged
        let cfg = rich_config();
        let v = cfg.to_json_value().unwrap();
        assert_eq!(ServerConfig::from_json_value(&v).unwrap(), cfg);
        // strings that YAML would read as other types stay strings, `${…}` is not expanded
        let mut v = ServerConfig::default().to_json_value().unwrap();
        v["api"]["token"] = serde_json::json!("yes");
        v["server"]["data_dir"] = serde_json::json!("/srv/${HOME}: \"x\"\n#y");
        let back = ServerConfig::from_json_value(&v).unwrap();
        assert_eq!(back.api.token.as_deref(), Some("yes"));
        assert_eq!(back.server.data_dir, "/srv/${HOME}: \"x\"\n#y");
        // unknown keys and wrong types name their path
        let mut v = ServerConfig::default().to_json_value().unwrap();
        v["server"]["htttp"] = serde_json::json!({});
        let e = ServerConfig::from_json_value(&v).unwrap_err();
        assert_eq!(e.path, "server.htttp", "{e}");
        assert!(e.message.contains("htttp"), "{e}");
        let mut v = ServerConfig::default().to_json_value().unwrap();
        v["server"]["cores"] = serde_json::json!("many");
        let e = ServerConfig::from_json_value(&v).unwrap_err();
        assert_eq!(e.path, "server.cores", "{e}");
    }

    /// A small strict shape with a required field, for the error kinds the server
    /// configuration has no example of.
    #[derive(serde::Deserialize, Debug, Default, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Peer {
        name: String,
        #[serde(default)]
        ports: Vec<u16>,
    }

    #[derive(serde::Deserialize, Debug, Default, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Mesh {
        #[serde(default)]
        first: Option<Peer>,
        #[serde(default)]
        peers: Vec<Peer>,
    }

    fn mesh_err(text: &str) -> (String, Option<u64>, String) {
        parts(deserialize_tracked::<Mesh>(text))
    }

    #[test]
    fn error_paths_from_saphyr_locations() {
        // missing field: the block mapping's path, in a sequence of mappings
        let (path, line, msg) = mesh_err("peers:\n  - name: a\n  - ports: [1]\n");
        assert_eq!((path.as_str(), line), ("peers[1]", Some(3)), "{msg}");
        assert!(
            msg.contains("missing field") && msg.contains("name"),
            "{msg}"
        );
        // missing field in a flow mapping (located at its first key) and in an empty one
        let (path, _, _) = mesh_err("first: {ports: [1]}\n");
        assert_eq!(path, "first");
        let (path, _, _) = mesh_err("peers: [{name: a}, {}]\n");
        assert_eq!(path, "peers[1]");
        // wrong type deep in a sequence, after comments and a multi-line scalar
        let (path, line, _) = mesh_err(
            "# peers\nfirst:\n  name: >\n    folded\n    name\n  # ports follow\n  ports: [1, x]\n",
        );
        assert_eq!((path.as_str(), line), ("first.ports[1]", Some(7)));
        // unknown field as the first key of a block mapping (same position as the mapping)
        let (path, _, _) = mesh_err("peers:\n  - nmae: a\n");
        assert_eq!(path, "peers[0].nmae");
        // merge keys: the key written next to the merge is named where it is written
        let (path, _, _) = mesh_err("first: &p {name: a}\npeers: [{<<: *p, port: 1}]\n");
        assert_eq!(path, "peers[0].port");
        // a problem inside an aliased node is named where the anchored text is
        let (path, line, _) = mesh_err("first: &p {name: a, ports: [z]}\npeers: [*p]\n");
        assert_eq!((path.as_str(), line), ("first.ports[0]", Some(1)));
        // a scalar where a mapping belongs
        let (path, _, _) = mesh_err("peers: [a]\n");
        assert_eq!(path, "peers[0]");
    }

    #[test]
    fn json_error_paths_from_saphyr_locations() {
        let e = from_json_value::<Mesh>(&serde_json::json!({
            "first": {"name": "a"},
            "peers": [{"name": "b", "ports": [1, 2]}, {"name": "c", "ports": [3, "four"]}]
        }))
        .unwrap_err();
        assert_eq!(e.path, "peers[1].ports[1]", "{e}");
        let e =
            from_json_value::<Mesh>(&serde_json::json!({"peers": [{"name": "b"}, {"ports": []}]}))
                .unwrap_err();
        assert_eq!(e.path, "peers[1]", "{e}");
        assert!(e.message.contains("name"), "{e}");
        let e =
            from_json_value::<Mesh>(&serde_json::json!({"first": {"name": "a", "x": {"y": 1}}}))
                .unwrap_err();
        assert_eq!(e.path, "first.x", "{e}");
    }
}
