//! The capture layer installed the way a command does it, through
//! `switchyard_service::logging::init_with_layer`: it sees exactly the events the configured
//! level lets through, beside the normal log output. (Its own test binary: the global
//! subscriber can be set once per process.)

use switchyard_api::diagnostics::LogLevel;
use switchyard_config::{LogFormat, LoggingConfig};
use switchyard_diagnostics::{LogStore, PageQuery};

#[test]
fn the_capture_layer_follows_the_configured_level_beside_the_log_file() {
    // The configured level must decide, not the caller's environment.
    std::env::remove_var("RUST_LOG");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("client.log");
    let cfg = LoggingConfig {
        level: "info".into(),
        format: LogFormat::Json,
        output: Some(file.to_string_lossy().into_owned()),
    };
    let logs = LogStore::new(100);
    switchyard_service::logging::init_with_layer(&cfg, "", Some(Box::new(logs.layer())))
        .expect("logging initialised");

    tracing::debug!("below the level");
    tracing::info!(host = "origin.test", "routed");
    tracing::warn!(error = "timeout", "dial failed");

    let page = logs.page(&PageQuery::default());
    let seen: Vec<(LogLevel, &str)> = page
        .entries
        .iter()
        .map(|e| (e.level, e.message.as_str()))
        .collect();
    assert_eq!(
        seen,
        [(LogLevel::Warn, "dial failed"), (LogLevel::Info, "routed")]
    );
    assert_eq!(page.entries[1].fields["host"], "origin.test");

    let written = std::fs::read_to_string(&file).expect("log file");
    assert!(written.contains("dial failed") && written.contains("routed"));
    assert!(!written.contains("below the level"));
}
