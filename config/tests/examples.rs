//! Every `config/examples/*.yaml` loads and validates without a single problem. Files are
//! dispatched by name: `pkgcache*.yaml` are `switchyard pkgcache` configurations,
//! `inventory*.yaml` are `switchyard inventory` configurations, `subtitles*.yaml` are
//! `switchyard subtitles` configurations, `client*.yaml` are `switchyard client` configurations, every other file is a server configuration.

use std::path::{Path, PathBuf};

use switchyard_config::client::{validate_client, ClientConfig};
use switchyard_config::inventory::{validate_inventory, InventoryConfig};
use switchyard_config::pkgcache::{validate_pkgcache, PkgcacheConfig};
use switchyard_config::subtitles::{validate_subtitles, SubtitlesConfig};
use switchyard_config::{validate, AuthMode, ServerConfig};

fn is_pkgcache(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("pkgcache"))
}

fn is_inventory(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("inventory"))
}

fn is_client(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("client"))
}

fn is_subtitles(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("subtitles"))
}

/// Server configuration examples.
fn examples() -> Vec<PathBuf> {
    all_examples()
        .into_iter()
        .filter(|p| !is_pkgcache(p) && !is_inventory(p) && !is_subtitles(p) && !is_client(p))
        .collect()
}

fn all_examples() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "expected server.yaml, minimal.yaml and pkgcache.yaml in {dir:?}"
    );
    files
}

fn uncomment(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("#: ") {
            Some(i) if l[..i].trim().is_empty() => format!("{}{}", &l[..i], &l[i + 3..]),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A service configuration has no problems and survives YAML and JSON round trips unchanged.
fn check_service_config<T, P>(
    name: &str,
    cfg: &T,
    problems: &[P],
    to_yaml: impl Fn(&T) -> String,
    from_yaml: impl Fn(&str) -> T,
) where
    T: PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    P: std::fmt::Display,
{
    assert!(
        problems.is_empty(),
        "{name} has problems:\n{}",
        problems
            .iter()
            .map(|p| format!("  {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let yaml = to_yaml(cfg);
    assert_eq!(&from_yaml(&yaml), cfg, "{name}: YAML round trip\n{yaml}");
    let json = serde_json::to_value(cfg).expect("to json");
    let back: T = serde_json::from_value(json).expect("from json");
    assert_eq!(&back, cfg, "{name}: JSON round trip");
}

fn check_pkgcache(name: &str, cfg: &PkgcacheConfig) {
    check_service_config(
        name,
        cfg,
        &validate_pkgcache(cfg),
        |c| c.to_yaml_string().expect("to yaml"),
        |y| PkgcacheConfig::from_yaml_str(y, &|_| None).expect("reload yaml"),
    );
}

/// `pkgcache*.yaml`: loads, validates, round-trips, and every `#: ` optional key is real.
#[test]
fn pkgcache_examples_load_validate_and_document_real_keys() {
    let files: Vec<PathBuf> = all_examples()
        .into_iter()
        .filter(|p| is_pkgcache(p))
        .collect();
    assert!(!files.is_empty(), "expected config/examples/pkgcache.yaml");
    for path in files {
        let name = path.display().to_string();
        let cfg = PkgcacheConfig::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cfg, PkgcacheConfig::default(), "{name}: shows the defaults");
        check_pkgcache(&name, &cfg);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains("#: "), "{name}: documents optional keys");
        let env = |n: &str| Some(format!("value-of-{n}"));
        let cfg = PkgcacheConfig::from_yaml_str(&uncomment(&text), &env)
            .unwrap_or_else(|e| panic!("{name} uncommented: {e}"));
        assert!(cfg.storage.s3.url.is_some() && !cfg.auth.users.is_empty());
        check_pkgcache(&format!("{name} (uncommented)"), &cfg);
    }
}

fn check_inventory(name: &str, cfg: &InventoryConfig) {
    check_service_config(
        name,
        cfg,
        &validate_inventory(cfg),
        |c| c.to_yaml_string().expect("to yaml"),
        |y| InventoryConfig::from_yaml_str(y, &|_| None).expect("reload yaml"),
    );
}

/// `inventory*.yaml`: loads, validates, round-trips, and every `#: ` optional key is real.
#[test]
fn inventory_examples_load_validate_and_document_real_keys() {
    let files: Vec<PathBuf> = all_examples()
        .into_iter()
        .filter(|p| is_inventory(p))
        .collect();
    assert!(!files.is_empty(), "expected config/examples/inventory.yaml");
    for path in files {
        let name = path.display().to_string();
        let cfg = InventoryConfig::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            cfg,
            InventoryConfig::default(),
            "{name}: shows the defaults"
        );
        check_inventory(&name, &cfg);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains("#: "), "{name}: documents optional keys");
        let env = |n: &str| Some(format!("value-of-{n}-long-enough-for-a-secret"));
        let cfg = InventoryConfig::from_yaml_str(&uncomment(&text), &env)
            .unwrap_or_else(|e| panic!("{name} uncommented: {e}"));
        assert!(cfg.database.url.is_some() && cfg.session.secret.is_some());
        check_inventory(&format!("{name} (uncommented)"), &cfg);
    }
}

fn check_subtitles(name: &str, cfg: &SubtitlesConfig) {
    check_service_config(
        name,
        cfg,
        &validate_subtitles(cfg),
        |c| c.to_yaml_string().expect("to yaml"),
        |y| SubtitlesConfig::from_yaml_str(y, &|_| None).expect("reload yaml"),
    );
}

/// `subtitles*.yaml`: loads, validates, round-trips, and every `#: ` optional key is real.
#[test]
fn subtitles_examples_load_validate_and_document_real_keys() {
    let files: Vec<PathBuf> = all_examples()
        .into_iter()
        .filter(|p| is_subtitles(p))
        .collect();
    assert!(!files.is_empty(), "expected config/examples/subtitles.yaml");
    for path in files {
        let name = path.display().to_string();
        let cfg = SubtitlesConfig::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            cfg,
            SubtitlesConfig::default(),
            "{name}: shows the defaults"
        );
        check_subtitles(&name, &cfg);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains("#: "), "{name}: documents optional keys");
        let env = |n: &str| Some(format!("value-of-{n}"));
        let cfg = SubtitlesConfig::from_yaml_str(&uncomment(&text), &env)
            .unwrap_or_else(|e| panic!("{name} uncommented: {e}"));
        assert!(
            cfg.transcription.url.is_some()
                && cfg.transcription.api_key.is_some()
                && cfg.translation.server.api_key.is_some()
        );
        check_subtitles(&format!("{name} (uncommented)"), &cfg);
    }
}

fn check(name: &str, cfg: &ServerConfig) {
    let problems = validate(cfg);
    assert!(
        problems.is_empty(),
        "{name} has problems:\n{}",
        problems
            .iter()
            .map(|p| format!("  {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // and it survives a YAML and a JSON round trip
    let yaml = cfg.to_yaml_string().expect("to yaml");
    let back = ServerConfig::from_yaml_str(&yaml, &|_| None).expect("reload yaml");
    assert_eq!(&back, cfg, "{name}: YAML round trip\n{yaml}");
    let json = serde_json::to_value(cfg).expect("to json");
    let back: ServerConfig = serde_json::from_value(json).expect("from json");
    assert_eq!(&back, cfg, "{name}: JSON round trip");
}

#[test]
fn every_example_loads_and_validates() {
    for path in examples() {
        let cfg = ServerConfig::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        check(&path.display().to_string(), &cfg);
    }
}

/// Optional keys are shown as `#: key: value`; uncommented they must load and validate too,
/// so the example cannot document a key that does not exist.
#[test]
fn optional_keys_in_examples_are_real() {
    let env = |name: &str| Some(format!("value-of-{name}"));
    for path in examples() {
        let text = std::fs::read_to_string(&path).expect("read");
        if !text.contains("#: ") {
            continue;
        }
        let uncommented: String = text
            .lines()
            .map(|l| match l.find("#: ") {
                Some(i) if l[..i].trim().is_empty() => format!("{}{}", &l[..i], &l[i + 3..]),
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        let cfg = ServerConfig::from_yaml_str(&uncommented, &env)
            .unwrap_or_else(|e| panic!("{} uncommented: {e}\n{uncommented}", path.display()));
        check(&format!("{} (uncommented)", path.display()), &cfg);
    }
}

#[test]
fn full_example_is_what_it_says() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/server.yaml");
    let cfg = ServerConfig::load_file(&path).expect("load");
    assert_eq!(cfg.auth.mode, AuthMode::Native);
    let alice = &cfg.auth.native.users[0];
    assert_eq!(alice.username, "alice");
    assert!(bcrypt::verify("wonderland", &alice.password_hash).expect("bcrypt"));
    assert!(alice.password_hash.starts_with("$2b$10$"));
}

fn check_client(name: &str, cfg: &ClientConfig) {
    check_service_config(
        name,
        cfg,
        &validate_client(cfg),
        |c| c.to_yaml_string().expect("to yaml"),
        |y| ClientConfig::from_yaml_str(y, &|_| None).expect("reload yaml"),
    );
}

/// `client*.yaml`: loads, shows the defaults, validates, round-trips, and every `#: ` optional
/// key is real.
#[test]
fn client_examples_load_validate_and_document_real_keys() {
    let files: Vec<PathBuf> = all_examples()
        .into_iter()
        .filter(|p| is_client(p))
        .collect();
    assert!(!files.is_empty(), "expected config/examples/client.yaml");
    for path in files {
        let name = path.display().to_string();
        let cfg = ClientConfig::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cfg, ClientConfig::default(), "{name}: shows the defaults");
        check_client(&name, &cfg);
        let text = std::fs::read_to_string(&path).expect("read");
        let env = |n: &str| Some(format!("value-of-{n}"));
        let cfg = ClientConfig::from_yaml_str(&uncomment(&text), &env)
            .unwrap_or_else(|e| panic!("{name} uncommented: {e}"));
        assert!(
            cfg.servers.len() == 2 && !cfg.routing.routes.is_empty() && cfg.api.token.is_some()
        );
        check_client(&format!("{name} (uncommented)"), &cfg);
    }
}
