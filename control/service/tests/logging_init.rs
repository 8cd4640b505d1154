//! `init` without an extra layer still writes the configured level and format to the
//! configured file. (Its own test binary: the global subscriber can be set once per process.)

use switchyard_config::{LogFormat, LoggingConfig};

#[test]
fn init_writes_json_lines_at_the_configured_level_to_the_file() {
    // The configured level must decide, not the caller's environment.
    std::env::remove_var("RUST_LOG");
    let path = std::env::temp_dir().join(format!("sydiag-logging-init-{}.log", std::process::id()));
    let cfg = LoggingConfig {
        level: "info".into(),
        format: LogFormat::Json,
        output: Some(path.to_string_lossy().into_owned()),
    };
    switchyard_service::init_logging(&cfg, "").expect("logging initialised");
    tracing::debug!("below the level");
    tracing::info!(host = "origin.test", "kept");
    let written = std::fs::read_to_string(&path).expect("log file");
    let _ = std::fs::remove_file(&path);
    let lines: Vec<serde_json::Value> = written
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{written}");
    assert_eq!(lines[0]["fields"]["message"], "kept");
    assert_eq!(lines[0]["fields"]["host"], "origin.test");
    assert_eq!(lines[0]["level"], "INFO");
}
